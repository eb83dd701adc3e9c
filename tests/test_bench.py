"""Bench: metric definitions on hand-made timelines, arrival schedules, and the load generator
against a real tritonserver running the fixed-delay toy engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.bench import report
from pipeline.bench.load import LoadSpec, Record, Run, arrival_offsets, run_closed
from pipeline.bench.metrics import parse_slo, request_metrics, stats, summarize
from pipeline.bench.options import parse_levels
from pipeline.bench.toy import write_toy_repo
from pipeline.cli.tools import bench as bench_command
from pipeline.errors import LpxError


def rec(
    start: float, times: list[float], tokens: list[int] | None = None, error: str | None = None
) -> Record:
    return Record(
        start=start,
        sent=start,
        times=times,
        tokens=tokens or [1] * len(times),
        end=times[-1] if times else start,
        error=error,
    )


def run_of(records: list[Record], wall: float = 2.0) -> Run:
    return Run(
        records, wall, 0.1, "output_ids", {"mode": "closed", "concurrency": 2, "requests": len(records)}
    )


def test_itl_is_e2e_minus_ttft_over_osl_minus_one():
    # first response after 100 ms with 1 token, then 2 responses carrying 2 and 3 tokens: OSL 6
    m = request_metrics(rec(10.0, [10.1, 10.2, 10.35], [1, 2, 3]))
    assert m.ttft_ms == pytest.approx(100) and m.e2e_ms == pytest.approx(350) and m.osl == 6
    assert m.itl_ms == pytest.approx((350 - 100) / 5)
    assert request_metrics(rec(0.0, [0.2])).itl_ms is None  # one token: no ITL
    assert request_metrics(rec(0.0, [], error="boom")) is None


def test_stats_percentiles():
    s = stats([float(v) for v in range(1, 101)])
    assert s["mean"] == 50.5 and s["min"] == 1 and s["max"] == 100
    assert (
        s["p50"] == pytest.approx(50.5)
        and s["p90"] == pytest.approx(90.1)
        and s["p99"] == pytest.approx(99.01)
    )
    assert stats([]) is None


def test_summary_counts_failures_and_goodput():
    records = [
        rec(0.0, [0.1, 0.15, 0.2]),  # TTFT 100, ITL 50: good
        rec(0.0, [0.3, 0.32, 0.34]),  # TTFT 300: misses ttft
        rec(0.0, [0.1, 0.3, 0.5]),  # ITL 200: misses itl
        rec(0.0, [], error="RuntimeError: model crashed"),
    ]
    r = summarize(run_of(records), parse_slo("ttft=200ms,itl=0.1s"))
    assert (r["requests"], r["succeeded"], r["failed"]) == (4, 3, 1)
    assert r["errors"] == ["RuntimeError: model crashed"]
    assert r["good_requests"] == 1 and r["goodput_rps"] == pytest.approx(0.5)
    assert r["output_tokens_per_s"] == pytest.approx(9 / 2.0) and r["requests_per_s"] == pytest.approx(1.5)
    assert r["tokens_per_s_per_user"]["max"] == pytest.approx(1e3 / 20)  # 1 / ITL (ITL 20 ms)
    md = report.markdown(
        {
            "target": {"url": "u", "model": "m", "protocol": "grpc", "input_len": 1, "output_len": 3},
            "results": [r],
        }
    )
    assert "| c=2 | 3 | 1 |" in md and "model crashed" in md


def test_bad_slo_and_levels_name_the_fix():
    with pytest.raises(LpxError, match="ttft=200ms"):
        parse_slo("latency=3")
    assert parse_levels("1,4,16") == [1, 4, 16]
    with pytest.raises(LpxError, match="comma list"):
        parse_levels("1,x")


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_arrivals_seeded_with_the_right_mean_rate(burstiness):
    a = arrival_offsets(50.0, 20000, burstiness, seed=3)
    assert a[0] == 0 and np.all(np.diff(a) >= 0)
    assert np.array_equal(a, arrival_offsets(50.0, 20000, burstiness, seed=3))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.03)
    # gamma(k) gaps: coefficient of variation 1/sqrt(k) (Poisson: 1)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_every_request_failing_is_an_error(tmp_path):
    port = __import__("pipeline.servers.child", fromlist=["free_ports"]).free_ports("127.0.0.1", 1)[0]
    res = CliRunner().invoke(
        bench_command,
        [
            "--url",
            f"127.0.0.1:{port}",
            "--model",
            "tensorrt_llm",
            "--concurrency",
            "2",
            "--requests",
            "2",
            "--warmup",
            "0",
            "--out",
            str(tmp_path / "out"),
            "--label",
            "fp8-run",
            "--variant",
            "m/fp8",
            "--gpu",
            "h200",
        ],
    )
    assert res.exit_code != 0 and isinstance(res.exception, LpxError)
    doc = __import__("json").loads((tmp_path / "out" / "results.json").read_text())
    assert doc["label"] == "fp8-run" and doc["variant"] == {"model": "m", "name": "fp8"}  # for lpx compare
    assert "roofline skipped" in doc["roofline_note"]  # no --checkpoint/--format, no quantize artifact
    assert doc["target"]["vocab"] == [100, 30000] and doc["target"]["prompts"]["vocab_from"] == "default"
    assert any("pass --vocab LO,HI" in note for note in doc["notes"])  # the served vocabulary is unknown


@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_fixed_delay_server_measured_right(tmp_path, protocol):
    from pipeline.servers.tritonserver import TritonServer

    first_ms, every_ms, osl = 100.0, 20.0, 8
    with TritonServer(write_toy_repo(tmp_path / "repo", first_ms, every_ms), ready_timeout_s=60) as srv:
        url = srv.grpc_url if protocol == "grpc" else srv.http_url
        spec = LoadSpec(url=url, model="tensorrt_llm", protocol=protocol, input_len=32, output_len=osl)
        run = run_closed(spec, 4, 8, warmup=4)
        r = summarize(run, parse_slo("ttft=150ms"))
    # the toy stamps each response with its server-side emit time, on the client's wall clock
    assert all(len(x.emits_ns) == osl and x.emits_ns[0] > x.sent_ns for x in run.records)
    assert r["failed"] == 0 and r["succeeded"] == 8 and r["osl"]["min"] == r["osl"]["max"] == osl
    # TTFT also holds transport and the python backend's queue: a few ms on 2 busy cores (see the self-check)
    assert first_ms <= r["ttft_ms"]["mean"] <= first_ms + 12
    assert r["itl_ms"]["mean"] == pytest.approx(every_ms, abs=1.0)
    assert r["good_requests"] == 8


@pytest.mark.triton
@pytest.mark.slow
def test_bench_serves_a_config_variant_itself(demo_config, tmp_path):
    """`lpx bench -c F --variant V`: stages from cache or run, server started on 127.0.0.1, measured, stopped."""
    import json as _json

    from click.testing import CliRunner

    from pipeline.cli.tools import bench as bench_command

    out = tmp_path / "run"
    res = CliRunner().invoke(
        bench_command,
        [
            "-c",
            str(demo_config),
            "--variant",
            "fp8",
            "--model",
            "tensorrt_llm",
            "--concurrency",
            "2",
            "--requests",
            "4",
            "--warmup",
            "1",
            "--input-len",
            "8",
            "--output-len",
            "8",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    doc = _json.loads((out / "results.json").read_text())
    # no --vocab: the ids come from the served repository's vocabulary (the demo's is 512 tokens)
    from pipeline.artifacts import Store

    repo_key = doc["variant"]["artifact_keys"]["repo:any"]
    repo = next(a for a in Store().all() if a.stage == "repo" and a.key == repo_key)
    vocab = _json.loads((repo.path / "preprocessing/1/tokenizer/config.json").read_text())
    assert doc["target"]["vocab"] == [100, vocab["vocab_size"]] and vocab["vocab_size"] < 30000
    assert doc["target"]["prompts"]["vocab_from"].endswith("tokenizer/config.json")
    _tune_cells_are_artifacts_gc_sees(demo_config, repo.path)
    assert doc["variant"]["name"] == "fp8" and doc["variant"]["model"] == "tiny-llama"
    assert doc["variant"]["config"]["build"]["max_batch_size"] == 8
    assert set(doc["variant"]["artifact_keys"]) == {"quantize", "eval", "build:any", "repo:any"}
    (level,) = doc["results"]
    assert level["succeeded"] == 4 and level["failed"] == 0


def _tune_cells_are_artifacts_gc_sees(config: Path, repo_path: Path) -> None:
    """`lpx tune`'s cell measurements are artifacts beside the repository they measured: found again by
    key, and `lpx artifacts gc` keeps one whose repository the config references and removes the others."""
    from pipeline import gc
    from pipeline.artifacts import Store, read_manifest
    from pipeline.tune.cells import STAGE, cell_slot, save_cell

    store = Store()
    repo = next(a for a in store.all() if a.path == repo_path)
    slot = cell_slot(store, repo.manifest["model"], repo)
    for key, measured in (("c0ffee000001", repo.key), ("c0ffee000002", "feedface0000")):
        with store.lock(slot):
            save_cell(store, slot, {"repo": measured}, {"key": key, "measured_s": 1.0}, 0.0)
    assert read_manifest(slot / "c0ffee000001")["results"] == {"key": "c0ffee000001", "measured_s": 1.0}
    assert store.lookup(STAGE, repo.manifest["model"], slot.parent.name, slot.name, "c0ffee000001")
    plan = gc.collect([config], store)
    listed = {c.path: c.reason for c in plan.candidates}
    assert slot / "c0ffee000001" not in listed
    assert "measures repository feedface0000" in listed[slot / "c0ffee000002"]
    gc.remove(plan, store)
    assert (slot / "c0ffee000001").is_dir() and not (slot / "c0ffee000002").exists()


def test_lengths_from_a_distribution_and_prompts_from_a_dataset(tmp_path):
    from pipeline.bench.load import ENGINE, LoadSpec, _tensors, draw_len

    rng = np.random.default_rng(0)
    fixed = {draw_len(128, 0, rng) for _ in range(50)}
    spread = [draw_len(128, 32, rng) for _ in range(4000)]
    assert fixed == {128} and min(spread) >= 1 and abs(np.mean(spread) - 128) < 2 and 28 < np.std(spread) < 36
    spec = LoadSpec(url="x", model=ENGINE, input_len=64, output_len=16, input_len_std=8, output_len_std=4)
    lens = {int(_tensors(spec, rng)[0]["input_lengths"][1][0, 0]) for _ in range(30)}
    assert len(lens) > 5, "input lengths should vary per request"
    texts = LoadSpec(url="x", prompts=("alpha beta", "gamma"))
    seen = {_tensors(texts, rng)[0]["text_input"][1][0, 0].decode() for _ in range(40)}
    assert seen == {"alpha beta", "gamma"}
