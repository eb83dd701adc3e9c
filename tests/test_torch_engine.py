"""The torch reference engine: exact greedy parity with `generate`, in-flight batching, errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from helpers_engine import reference_greedy

from pipeline.errors import LpxError
from pipeline.runtime.engines.torch_engine import TorchEngine
from pipeline.runtime.engines.torch_meta import read_meta
from pipeline.runtime.engines.torch_stats import BatchLog

pytestmark = pytest.mark.slow
PROMPTS = ["The first token of an answer", "Bread is made", "A good engineer", "Numbers tell stories"]


@pytest.fixture(scope="module")
def engine(torch_engine):
    return torch_engine


@pytest.fixture(scope="module")
def tokenizer(torch_engine_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(torch_engine_dir)


def test_greedy_matches_generate(engine: TorchEngine, tokenizer, torch_engine_dir: Path) -> None:
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        expected = reference_greedy(torch_engine_dir, ids, 40, tokenizer.eos_token_id)
        stream = engine.submit(ids, 40, end_ids=[tokenizer.eos_token_id], temperature=0.0, top_k=1, top_p=0.0)
        deltas = list(stream)
        assert stream.finished
        assert [t for d in deltas for t in d] == stream.tokens == expected
        assert all(len(d) >= 1 for d in deltas), (
            "every delta carries a token; the last one is flagged finished"
        )


def test_greedy_flavours_agree(engine: TorchEngine, tokenizer) -> None:
    """temperature 0, top_k 1, and no top_k/top_p at all are all greedy (TensorRT-LLM's rule)."""
    ids = tokenizer(PROMPTS[0])["input_ids"]
    a = engine.generate(ids, 12, temperature=0.0, top_k=50, top_p=0.9)
    b = engine.generate(ids, 12, temperature=0.7, top_k=1, top_p=0.0)
    c = engine.generate(ids, 12, temperature=1.0, top_k=0, top_p=0.0)
    assert a == b == c


def test_concurrent_requests_interleave(engine: TorchEngine, tokenizer) -> None:
    events: list[tuple[float, int, bool]] = []  # (time, request, finished)
    results: dict[int, list[int]] = {}
    lock = threading.Lock()

    def consume(i: int, stream) -> None:
        for _ in stream:
            with lock:
                events.append((time.perf_counter(), i, stream.finished))
        results[i] = stream.tokens

    streams = [engine.submit(tokenizer(p)["input_ids"], 24, temperature=0.0, top_k=1) for p in PROMPTS]
    threads = [threading.Thread(target=consume, args=(i, s)) for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1, 2, 3] and all(s.finished for s in streams)
    assert all(1 <= len(r) <= 24 for r in results.values())
    alone = [engine.generate(tokenizer(p)["input_ids"], 24, temperature=0.0, top_k=1) for p in PROMPTS]
    assert [results[i] for i in range(4)] == alone, "batching does not change greedy tokens"
    first_finish = min(t for t, _, done in events if done)
    started = {i for t, i, _ in events if t <= first_finish}
    assert started == {0, 1, 2, 3}, "every request produced tokens before any one finished"
    order = [i for _, i, _ in sorted(events)]
    assert any(a != b for a, b in zip(order, order[1:], strict=False)), (
        "tokens of different requests interleave"
    )


def test_cancel_ends_stream(engine: TorchEngine, tokenizer) -> None:
    stream = engine.submit(tokenizer(PROMPTS[0])["input_ids"], 400, temperature=0.8, top_k=20, top_p=0.9)
    got = 0
    for _ in stream:
        got += 1
        if got == 2:
            stream.cancel()
    assert 2 <= got < 400 and stream.finished


def test_iteration_stats_follow_the_batch_and_the_cache(
    engine: TorchEngine, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorRT-LLM's IterationStats from transformers' scheduler and paged cache: more requests than
    max_batch_size wait, the batch and the used KV blocks grow while they run, and all go back to 0.
    The stats are also read each time the scheduler forms a batch: polling alone missed every prompt's
    batch on a fast CPU (the demo model's step is shorter than the poll)."""
    log, per_batch = engine._stats.log, []

    def record_then_read(batch: list) -> None:
        BatchLog.record(log, batch)
        per_batch.append(engine.iteration_stats())

    monkeypatch.setattr(log, "record", record_then_read)
    max_batch = engine.meta["max_batch_size"]
    deadline = time.monotonic() + 10  # a request an earlier test cancelled leaves at the engine's next step
    while (before := engine.iteration_stats())["numActiveRequests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert before["kvCacheStats"]["usedNumBlocks"] == 0 and before["numActiveRequests"] == 0
    ids = tokenizer(PROMPTS[2])["input_ids"]
    streams = [engine.submit(ids * 3, 40, end_ids=[], temperature=0.0) for _ in range(max_batch + 2)]
    seen = [engine.iteration_stats()]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        seen[-1]["numActiveRequests"] + seen[-1]["numQueuedRequests"] or len(seen) < 3
    ):
        time.sleep(0.02)
        seen.append(engine.iteration_stats())
    for s in streams:
        list(s)
    monkeypatch.undo()
    assert per_batch, "no batch was formed"
    seen += per_batch
    after = engine.iteration_stats()
    busy = max(seen, key=lambda st: st["kvCacheStats"]["usedNumBlocks"])
    kv, batch = busy["kvCacheStats"], busy["inflightBatchingStats"]
    assert kv["maxNumBlocks"] == kv["usedNumBlocks"] + kv["freeNumBlocks"] and kv["usedNumBlocks"] > 0
    assert (
        kv["tokensPerBlock"] == engine.meta["tokens_per_block"] and busy["maxNumActiveRequests"] == max_batch
    )
    assert 0 < batch["numScheduledRequests"] <= max_batch
    assert max(st["numActiveRequests"] for st in seen) == max_batch + 2, "requests beyond the batch wait"
    assert any(st["inflightBatchingStats"]["numCtxTokens"] >= len(ids) * 3 for st in seen), (
        "a prompt was seen"
    )
    assert after["iter"] > before["iter"] and after["cpuMemUsage"] > 0
    assert after["numActiveRequests"] == after["kvCacheStats"]["usedNumBlocks"] == 0
    assert after["inflightBatchingStats"]["numScheduledRequests"] == 0


def test_limits_are_clear_errors(engine: TorchEngine) -> None:
    with pytest.raises(LpxError, match="max_input_len"):
        engine.submit([5] * (engine.meta["max_input_len"] + 1), 4)
    with pytest.raises(LpxError, match="max_seq_len"):
        engine.submit([5, 6], engine.meta["max_seq_len"])
    with pytest.raises(LpxError, match="vocabulary"):
        engine.submit([engine.vocab_size + 3], 4)


def test_engine_meta_errors(tmp_path: Path) -> None:
    with pytest.raises(LpxError, match="lpx build"):
        read_meta(tmp_path)
    (tmp_path / "lpx_engine.json").write_text("{not json")
    with pytest.raises(LpxError, match="not JSON"):
        read_meta(tmp_path)
    (tmp_path / "lpx_engine.json").write_text(json.dumps({"target": "torch"}))
    with pytest.raises(LpxError, match="lacks"):
        read_meta(tmp_path)
