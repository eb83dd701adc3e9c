"""`lpx tune`: the search space and its pruning with real model configs, the goodput search on an exact
queue model, and a known-answer run on real Triton servers whose toy engines' latency is set per cell."""

from __future__ import annotations

import heapq
import json
import subprocess
import sys

import pytest
import yaml

from pipeline.bench.load import LoadSpec, arrival_offsets
from pipeline.bench.toy import write_toy_repo
from pipeline.config import load_config, parse_config
from pipeline.errors import ConfigError, UsageError
from pipeline.facts.gpu import lookup_gpu
from pipeline.facts.models import numerics_of, shape_of
from pipeline.servers.tritonserver import TritonServer
from pipeline.tune import answer, space
from pipeline.tune.cells import Measurement, memory_in_use, search_all, slo_label
from pipeline.tune.run import Options, finish, measure_cells, parse_budget
from pipeline.tune.search import SearchSettings, search

# -- an exact model of the toy engine (pipeline/bench/toy.py with `slots`) -------------------------
# Times are long next to what Triton and the client add on a busy 2-core machine (a few ms per request).
FIRST, OSL, N, WARMUP = 40.0, 5, 24, 2  # ms to the first token, tokens per request, requests per level
SLO = {"ttft": 90.0, "itl": 30.0}
TOYS = {"wide": (4, 20.0), "narrow": (2, 12.0), "slow": (8, 40.0)}  # cell -> (slots, ms between tokens)


def queue(arrivals: list[float], slots: int, service: float) -> list[float]:
    """Start times (ms) of requests arriving at `arrivals` (in order) at a FIFO engine of `slots` slots,
    each holding its slot `service` ms."""
    free = [0.0] * slots
    starts = []
    for a in arrivals:
        start = max(a, heapq.heappop(free))
        heapq.heappush(free, start + service)
        starts.append(start)
    return starts


def exact(kind: str, load: float, slots: int, every: float, transport: float = 0.0) -> dict:
    """What summarize() would report for a level of the toy, computed exactly; `transport` (ms) is added
    to every TTFT (the client's and Triton's own time, which the toy's clock does not see)."""
    service = FIRST + (OSL - 1) * every
    if kind == "closed":  # `load` workers start together and send again as soon as an answer ends
        free = [0.0] * slots
        ready = [(0.0, w) for w in range(int(load))]
        ttfts, end = [], 0.0
        for _ in range(N):
            t, w = heapq.heappop(ready)
            start = max(t, heapq.heappop(free))
            heapq.heappush(free, start + service)
            ttfts.append(start - t + FIRST + transport)
            end = max(end, start + service)
            heapq.heappush(ready, (start + service, w))
        wall = end / 1e3
    else:
        arrivals = [o * 1e3 for o in arrival_offsets(load, N, 1.0, 0)]
        starts = queue(arrivals, slots, service)
        ttfts = [s - a + FIRST + transport for s, a in zip(starts, arrivals, strict=True)]
        wall = (max(starts) + service) / 1e3
    good = sum(1 for t in ttfts if t <= SLO["ttft"] and every <= SLO["itl"])
    return {
        "requests": N,
        "succeeded": N,
        "good_requests": good,
        "requests_per_s": N / wall,
        "goodput_rps": good / wall,
    }


def true_knee(slots: int, every: float, transport: float = 0.0, attainment: float = 0.9) -> float:
    """The highest Poisson rate (req/s, to 0.5%) at which the exact model passes: the known answer."""
    service = FIRST + (OSL - 1) * every
    rate, step = 0.5, 1.005
    best = 0.0
    while rate < 2 * slots / (service / 1e3):  # twice the capacity: far past any knee
        s = exact("poisson", rate, slots, every, transport)
        if s["good_requests"] / N >= attainment:
            best = rate
        rate *= step
    return best


SETTINGS = SearchSettings(attainment=0.9, max_concurrency=16, rate_steps=6)


def test_the_search_finds_the_exact_models_knees():
    """Driven by the exact model, the search lands on the true closed-loop knee and within its own
    resolution of the true Poisson knee; a cell that breaks the ITL SLO alone gets no goodput."""
    for name, (slots, every) in TOYS.items():
        result = search(lambda kind, load, s=slots, e=every: exact(kind, load, s, e), SETTINGS)
        if every > SLO["itl"]:
            assert result.goodput_rps == 0 and "not met even by one request" in result.reason, name
            continue
        closed = [c for c in range(1, 17) if exact("closed", c, slots, every)["good_requests"] / N >= 0.9]
        assert result.knee_concurrency == max(c for c in closed if all(x in closed for x in range(1, c + 1)))
        knee = true_knee(slots, every)
        assert knee > 0 and result.best_rate is not None
        assert abs(result.best_rate.load - knee) <= 0.05 * knee, (name, result.best_rate.load, knee)


SLO_ACCEPTED = {
    "ttft=200ms": {"ttft": 200.0},
    "TTFT=200ms": {"ttft": 200.0},
    "Ttft=200MS": {"ttft": 200.0},
    "itl=0.05s": {"itl": 50.0},
    "E2E=2S": {"e2e": 2000.0},
    "ttft=200": {"ttft": 200.0},
    "ttft=.5s": {"ttft": 500.0},
    " ttft = 200 ms , ITL=30ms ": {"ttft": 200.0, "itl": 30.0},
    "ttft=200ms,itl=30ms,e2e=1.5s": {"ttft": 200.0, "itl": 30.0, "e2e": 1500.0},
}
SLO_REFUSED = [
    *("", " ", "ttft", "ttft=", "ttft=fast", "p99<1s", "ttft:200ms", "latency=3", "ttft=200us"),
    *("ttft=200ms,", "ttft=200ms,,itl=3ms", "ttft=-5ms", "ttft=0", "ttft=1e3", "ttft=inf", "ttft=nan"),
    "ttft=200ms,TTFT=100ms",
]


def test_the_config_and_the_command_line_take_the_same_slos(tmp_path):
    """One SLO grammar: lpx.yaml's tune.slo, `lpx tune --slo` and `lpx bench --slo` accept (with the same
    milliseconds) and refuse (with the same message) the same strings, case and units included."""
    import click

    from pipeline.cli.tools import bench as bench_command
    from pipeline.cli.tune import tune as tune_command
    from pipeline.slo import parse_slo

    def config_problem(text: str) -> str | None:
        data = {"model": {"name": "m", "checkpoint": str(tmp_path)}, "variants": [{"name": "a"}]}
        try:
            parse_config({**data, "tune": {"slo": text}})
        except ConfigError as err:
            (line,) = err.problems
            return line.removeprefix("tune.slo: ")
        return None

    def cli_problem(command: click.Command, text: str) -> str | None:
        try:
            command.make_context(command.name, ["--slo", text])
        except click.BadParameter as err:
            return err.message
        return None

    for text, ms in SLO_ACCEPTED.items():
        assert parse_slo(text, required=True) == ms, text
        assert config_problem(text) is None, text
        assert cli_problem(tune_command, text) is None and cli_problem(bench_command, text) is None, text
    for text in SLO_REFUSED:
        why = config_problem(text)
        assert why is not None and why.startswith(f"Bad SLO {text!r}: ") and "ttft=200ms" in why, text
        assert cli_problem(tune_command, text) == why, text
        with pytest.raises(UsageError, match="Bad SLO"):
            parse_slo(text, required=True)
        if text.strip():  # blank --slo is no SLO for lpx bench (a plain load test), refused for tune
            assert cli_problem(bench_command, text) == why, text
    assert cli_problem(bench_command, "") is None and parse_slo(None) == {}


def test_pareto_and_best():
    def cell(name: str, goodput: float, kl: float, memory: float, batch: int) -> dict:
        return {
            "cell": name,
            "goodput_rps": goodput,
            "kl_mean": kl,
            "memory_gib": memory,
            "limits": {"max_batch_size": batch},
        }

    rows = [
        cell("a", 10.0, 0.01, 8.0, 8),
        cell("b", 12.0, 0.05, 8.0, 16),
        cell("c", 9.0, 0.02, 9.0, 8),
        cell("d", 12.0, 0.05, 6.0, 32),
        cell("e", 0.0, 0.0, 1.0, 1),
    ]
    assert answer.pareto(rows) == ["a", "d"]  # b: d has as much goodput in less memory; c: a beats it
    assert answer.best(rows)["cell"] == "d"  # the tie on goodput goes to less memory
    assert answer.best([rows[4]]) is None


def _llama_8b(tmp_path, gpu: str, **tune) -> tuple:
    ckpt = tmp_path / "llama-3.1-8b"
    ckpt.mkdir(parents=True)
    model_config = {**shape_of("llama-3.1-8b"), **numerics_of("llama-3.1-8b")}
    (ckpt / "config.json").write_text(json.dumps(model_config))
    cfg = parse_config(
        {
            "model": {"name": "llama", "checkpoint": str(ckpt)},
            "variants": [
                {"name": "fp8", "quantization": {"format": "fp8", "kv_cache": "fp8"}},
                {"name": "bf16", "quantization": {"format": "none"}},
            ],
            "build": {"target": "engine", "gpu": gpu, "max_input_len": 4096, "max_seq_len": 8192},
            "tune": {"input_len": 2048, "output_len": 2048, **tune},
        }
    )
    return cfg, lookup_gpu(gpu), model_config


def test_the_default_grid_follows_lpx_plan_and_pruning_names_the_reason(tmp_path):
    """Llama-3.1-8B at 4096 tokens per sequence. On an L4 (24 GB) 9 sequences of bf16 KV fit beside the
    bf16 weights and 43 of fp8 KV beside fp8 weights (lpx plan); a batch beyond that is pruned, as is
    fp8 on an A10G (sm86). Without a grid the batches come from lpx plan's suggestion on an H200."""
    grid = {"max_batch_size": [8, 64], "max_num_tokens": [8192]}
    cfg, l4, llama = _llama_8b(tmp_path / "l4", "l4", grid=grid)
    cells = {c.name: c for c in space.cells(cfg, cfg.tune, l4, llama)}
    assert cells["bf16 b8 t8192"].pruned is None and cells["fp8 b8 t8192"].pruned is None
    assert (
        "max_batch_size 64 > the 9 sequences of 4096 tokens whose bf16 KV" in cells["bf16 b64 t8192"].pruned
    )
    assert (
        "max_batch_size 64 > the 43 sequences" in cells["fp8 b64 t8192"].pruned
        and "L4" in cells["fp8 b64 t8192"].pruned
    )
    cfg, a10g, llama = _llama_8b(tmp_path / "a10g", "a10g", grid=grid)
    cells = {c.name: c for c in space.cells(cfg, cfg.tune, a10g, llama)}
    assert "fp8 does not run on A10G" in cells["fp8 b8 t8192"].pruned
    cfg, h200, llama = _llama_8b(tmp_path / "h200", "h200")
    rows = space.plan_rows(cfg, cfg.tune, h200, llama)
    assert space.grid_values(cfg, cfg.tune, cfg.variant("fp8"), rows["fp8"])["max_batch_size"] == [128, 256]
    assert space.grid_values(cfg, cfg.tune, cfg.variant("bf16"), rows["bf16"])["max_batch_size"] == [64, 128]
    assert all(c.pruned is None for c in space.cells(cfg, cfg.tune, h200, llama))
    assert space.grid_values(cfg, cfg.tune, cfg.variant("fp8"), None)["max_batch_size"] == [4, 8]  # no GPU


def test_bad_input_is_refused_with_the_fix(tmp_path, demo_config):
    cfg, l4, llama = _llama_8b(tmp_path, "l4", grid={"max_batch_size": [8]})
    cfg.build.max_input_len = 2048
    cfg.build.max_seq_len = 4096
    cfg.tune.output_len = 4000
    with pytest.raises(Exception, match="input_len \\+ output_len"):
        space.cells(cfg, cfg.tune, l4, llama)
    with pytest.raises(Exception, match="NAME=http"):
        space.remote_cells(["vllm"])
    assert parse_budget("90m") == 5400 and parse_budget("2h") == 7200 and parse_budget(None) is None
    lpx = [sys.executable, "-m", "pipeline", "tune", "-c", str(demo_config)]
    run = subprocess.run(lpx, capture_output=True, text=True)
    assert run.returncode == 2 and "needs an SLO" in run.stderr
    run = subprocess.run([*lpx, "--slo", "ttft=fast"], capture_output=True, text=True)
    assert run.returncode != 0 and "Bad SLO" in run.stderr and "Traceback" not in run.stderr
    bad = yaml.safe_load(demo_config.read_text())
    bad["tune"] = {"slo": "p99<1s", "grid": {"max_batch_size": [4, 4]}}
    with pytest.raises(ConfigError) as err:
        parse_config(bad)
    assert any(line.startswith("tune.slo: Bad SLO 'p99<1s'") for line in err.value.problems)
    assert "tune.grid.max_batch_size: Value error, lists a value twice" not in err.value.problems
    assert any(
        line.startswith("tune.grid.max_batch_size: lists a value twice") for line in err.value.problems
    )


@pytest.mark.triton
@pytest.mark.slow
def test_tune_picks_the_cell_with_the_most_goodput_and_finds_its_knee(tmp_path):
    """Three cells, each a real Triton serving the toy engine with its own slots and speed: tune's answer
    (the best cell, its Poisson knee) against the exact model's, and the tuned config it writes."""
    m = Measurement(slos=[SLO], input_len=8, output_len=OSL, requests=N, warmup=WARMUP, search=SETTINGS)
    cfg = parse_config(
        {
            "model": {"name": "toy", "checkpoint": str(tmp_path)},
            "variants": [{"name": name} for name in TOYS],
            "build": {"max_num_tokens": 256},
        }
    )
    cells = [
        space.Cell(name, {"max_batch_size": slots, "max_num_tokens": 256})
        for name, (slots, _) in TOYS.items()
    ]

    def measure(cell: space.Cell, say) -> dict:
        slots, every = TOYS[cell.variant]
        repo = write_toy_repo(tmp_path / cell.variant, FIRST, every, slots=slots)
        with TritonServer(repo, ready_timeout_s=60) as srv:
            spec = LoadSpec(
                url=srv.grpc_url, model="tensorrt_llm", input_len=8, output_len=OSL, vocab=(100, 200)
            )
            results = search_all(spec, m, say)
            memory = memory_in_use(srv.proc.pid)
        return {"cell": cell.as_dict(), "gpus": 1, "memory": memory, "slo": results, "cached": False}

    from pipeline.progress import Reporter

    docs, not_run = measure_cells(cells, measure, None, Reporter())
    assert not_run == [] and len(docs) == 3
    quality = {name: {"kl_mean": 0.0, "top1_agreement": 1.0} for name in TOYS}
    doc = finish(
        cfg, Options([slo_label(SLO)], tmp_path / "out"), m, cells, docs, quality, [], lambda _: None
    )
    part = doc["slos"][slo_label(SLO)]
    # The known answer: the exact queue model, with the transport time this machine adds to a TTFT
    # (measured by each cell's first level, one request at a time: its TTFT p50 minus the toy's FIRST)
    truth = {}
    for cell in docs:
        name = cell["cell"]["variant"]
        first_level = cell["slo"][slo_label(SLO)]["levels"][0]
        transport = first_level["ttft_ms"]["p50"] - FIRST
        assert 0 <= transport < 15, f"{name}: {transport:.1f} ms of transport - the machine is too busy"
        truth[name] = true_knee(*TOYS[name], transport)
    assert truth["slow"] == 0 and truth["wide"] > truth["narrow"] > 0
    assert part["best"]["cell"] == "wide b4 t256"
    for row in part["rows"]:
        name = row["variant"]
        if truth[name] == 0:
            assert row["goodput_rps"] == 0
        else:  # the search's knee within 10% of the known one
            assert abs(row["rate_rps"] - truth[name]) <= 0.10 * truth[name], (
                name,
                row["rate_rps"],
                truth[name],
            )
    tuned = load_config(tmp_path / "out" / "lpx.tuned.yaml")
    assert [v.name for v in tuned.variants] == ["wide"] and tuned.build.max_batch_size == 4
    assert (tmp_path / "out" / "tune.md").read_text().count("| wide b4 t256 |") == 1
    assert {p.split("/")[-1] for p in doc["plots"]} == {"goodput-1.png", "front-1.png"}


def test_dataset_prompts_become_the_models_token_ids_cut_to_the_build(tmp_path, demo_config):
    import numpy as np
    from transformers import AutoTokenizer

    from pipeline.bench.load import _tensors
    from pipeline.tune.run import dataset_prompts

    cfg = load_config(demo_config)
    cfg.build.max_input_len, cfg.build.max_seq_len = 16, 40
    texts = ["Bread is made of flour and water and salt and time and patience and heat.", "Tea?", ""]
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": t}) for t in texts))
    info, ids = dataset_prompts(cfg, data, "prompt", 32)
    tok = AutoTokenizer.from_pretrained(cfg.model.checkpoint)
    assert info["prompts"] == 2 and info["cut_to"] == 8  # max_seq_len 40 - 32 output tokens
    assert [list(i) for i in ids] == [tok(t)["input_ids"][:8] for t in texts[:2]]
    spec = LoadSpec(url="-", model="tensorrt_llm", prompt_ids=ids)
    sent = {tuple(_tensors(spec, np.random.default_rng(s))[0]["input_ids"][1][0]) for s in range(20)}
    assert sent == {tuple(i) for i in ids}


def test_the_rate_search_climbs_when_the_closed_loop_undershoots_and_reports_zero_when_nothing_passes():
    """Closed loop: concurrency <= 4 passes at 5 req/s per slot (20 req/s at the knee). Poisson passes
    below `knee` req/s. Above the closed loop's rate the search climbs by half, then bisects."""

    def measure(knee: float):
        def run(kind: str, load: float) -> dict:
            ok = load <= 4 if kind == "closed" else load < knee
            rps = 5.0 * min(load, 4) if kind == "closed" else load
            return {"requests": 20, "succeeded": 20, "good_requests": 20 if ok else 0, "requests_per_s": rps}

        return run

    settings = SearchSettings(attainment=0.9, max_concurrency=64, rate_steps=6)
    result = search(measure(27.0), settings)
    assert result.knee_concurrency == 4
    loads = [lv.load for lv in result.levels if lv.kind == "poisson"]
    assert loads[:2] == [20.0, 30.0]  # passed at the closed loop's rate: one step up, which fails
    assert 26.0 <= result.best_rate.load < 27.0 and result.goodput_rps == result.best_rate.load
    nothing = search(measure(0.0), settings)
    assert nothing.knee_concurrency == 4 and nothing.goodput_rps == 0 and "no Poisson rate" in nothing.reason
