"""The pure parts of the benches in pipeline/bench/ (what scripts/*.py used to compute inline), on the shapes
their inputs really have: /metrics text as Triton and vLLM (prometheus_client) write it, `lpx bench`'s
results.json levels (pipeline.bench.metrics.summarize), AIPerf's profile_export_aiperf.json, the load
generator's Records; and the one error line a script prints for bad input."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from pipeline.bench import gateway_ab, gateway_bench, gateway_clients, repo_bench, selfcheck
from pipeline.bench.load import Record, Run
from pipeline.bench.metrics import summarize
from pipeline.bench.quantize_bench import above_start, tree_bytes
from pipeline.bench.script import run_script
from pipeline.bench.server_metrics import histogram_totals, mean_ms, model_counters
from pipeline.bench.vllm_compare import cpu_used
from pipeline.bench.vllm_measure import aiperf_result, row, table, vllm_own_column, vllm_own_table
from pipeline.errors import StageFailed, UsageError
from pipeline.monitoring.scrape import parse

# Triton's metrics port, as its docs show the families (triton-inference-server/server
# docs/user_guide/metrics.md, main, read 2026-12-07): counters per model and version
TRITON = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="postprocessing",version="1"} 48
nv_inference_request_success{model="preprocessing",version="1"} 3
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="postprocessing",version="1"} 1200
nv_inference_compute_infer_duration_us{model="postprocessing",version="2"} 300
nv_inference_compute_infer_duration_us{model="tensorrt_llm",version="1"} 99999
"""


def vllm_text(observations: dict[str, list[float]]) -> str:
    """/metrics as vLLM's OpenAI server writes it (prometheus_client's exposition, histograms labelled by
    model_name and engine), with `observations` (seconds) made."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    registry = CollectorRegistry()
    for name, values in observations.items():
        hist = Histogram(name, name, ["model_name", "engine"], registry=registry)
        for i, v in enumerate(values):
            hist.labels(model_name="vllm-own", engine=str(i % 2)).observe(v)
    return generate_latest(registry).decode()


def test_triton_counters_of_one_model():
    got = model_counters(parse(TRITON), "postprocessing")
    assert got["nv_inference_request_success"] == 48
    assert got["nv_inference_compute_infer_duration_us"] == 1500  # both versions
    assert got["nv_inference_exec_count"] == 0  # not reported
    assert model_counters(parse(TRITON), "nothing") == dict.fromkeys(got, 0.0)


def test_vllm_histograms_between_two_reads():
    families = ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds")
    names = {"ttft": families[0], "queue": families[1]}
    before = histogram_totals(parse(vllm_text({families[0]: [0.010], families[1]: []})), names)
    after = histogram_totals(parse(vllm_text({families[0]: [0.010, 0.020, 0.040], families[1]: []})), names)
    assert after["ttft"] == (pytest.approx(0.07), 3.0)
    means = mean_ms(before, after)
    assert means["ttft"] == pytest.approx(30.0) and math.isnan(means["queue"])


def level(c: int, ttft_ms: float, itl_ms: float, tokens: int = 4) -> dict:
    """One results.json level as `lpx bench` writes it: summarize() over requests of `tokens` tokens."""
    records = []
    for i in range(3):
        start = 10.0 * i
        rec = Record(start=start, sent=start)
        rec.times = [start + (ttft_ms + k * itl_ms) / 1000 for k in range(tokens)]
        rec.tokens = [1] * tokens
        rec.end = rec.times[-1]
        records.append(rec)
    load = {"mode": "closed", "concurrency": c, "requests": 3, "warmup": 1}
    return summarize(Run(records, 30.0, 0.1, "output_ids", load))


def test_the_bench_table_takes_medians_over_rounds():
    rounds = [{"results": [level(1, t, 5.0), level(4, 2 * t, 6.0)]} for t in (10.0, 30.0, 20.0)]
    assert set(row(rounds[0])) == {1, 4} and row(rounds[0])[1]["ttft_p50"] == pytest.approx(10.0)
    lines = table({"lpx-vllm": rounds}).splitlines()
    assert lines[0] == "| server | c | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | tok/s | req/s |"
    assert lines[2].startswith("| lpx-vllm | 1 | 20.0 | 20.0 | 5.0 | ")
    assert lines[3].startswith("| lpx-vllm | 4 | 40.0 | 40.0 | 6.0 | ")
    used = cpu_used(
        "lpx-vllm",
        {"lpx-vllm": {"gateway": 1.0}, "vllm-own": {"vLLM engine": 5.0}},
        {"lpx-vllm": {"gateway": 1.5, "python stubs": 0.25}, "vllm-own": {"vLLM engine": 5.5}},
        rounds[0],
    )
    assert used == {"own": {"gateway": 0.5, "python stubs": 0.25}, "tokens": 2 * (3 + 1) * 4.0, "idle": 0.5}


def test_aiperf_export_becomes_a_level():
    doc = {  # profile_export_aiperf.json's shape (ai-dynamo/aiperf docs/tutorials/working-with-profile-exports.md)
        "request_throughput": {"unit": "requests/sec", "avg": 13.16},
        "time_to_first_token": {"unit": "ms", "avg": 1588.8, "p50": 787.5, "p99": 4100.0},
        "inter_token_latency": {"unit": "ms", "avg": 51.8, "p50": 51.9, "p99": 55.9},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 1274.6},
    }
    got = aiperf_result(doc, 16)
    assert row({"results": [got]})[16] == {
        "ttft_p50": 787.5,
        "ttft_p99": 4100.0,
        "itl_p50": 51.9,
        "tok_s": 1274.6,
        "req_s": 13.16,
    }
    doc["time_to_first_token"]["unit"] = "s"
    with pytest.raises(StageFailed, match="AIPerf reported time_to_first_token in s, not ms"):
        aiperf_result(doc, 16)


def test_vllm_own_split():
    done = [{"sent": 1.0, "chunks": [1.010]}, {"sent": 2.0, "chunks": [2.030]}, {"sent": 3.0, "chunks": []}]
    col = vllm_own_column(done, {"ttft": 15.0, "queue": 1.0, "prefill": 4.0})
    assert col["client"] == pytest.approx(20.0) and col["front"] == pytest.approx(5.0)
    assert col["rest"] == pytest.approx(10.0)
    lines = vllm_own_table([1], [col]).splitlines()
    assert lines[:3] == ["| mean ms | c=1 |", "|---|---|", "| TTFT (client) | 20.00 |"]
    assert lines[-1] == "| vLLM's TTFT - queue - prefill (API server <-> engine core) | 10.00 |"


def test_repo_bench_figures(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"pad_token_id": None, "vocab_size": 512}))
    assert repo_bench.end_id(tmp_path) == 511
    (tmp_path / "config.json").write_text(json.dumps({"pad_token_id": 3, "vocab_size": 512}))
    assert repo_bench.end_id(tmp_path) == 3
    assert repo_bench.pct([5.0, 1.0, 3.0, 2.0, 4.0], 0.9) == 5.0
    lat = {"tensorrt_llm": [0.010, 0.012, 0.011], "ensemble": [0.013, 0.015, 0.014], "tensorrt_llm_bls": []}
    rows = repo_bench.overhead_rows(lat, {"tensorrt_llm": 16, "ensemble": 16, "tensorrt_llm_bls": -1})
    assert set(rows) == {"tensorrt_llm", "ensemble"}  # a model that failed has no row
    assert rows["ensemble"]["overhead_median_ms"] == pytest.approx(3.0)
    assert rows["ensemble"]["overhead_p90_ms"] == pytest.approx(3.0) and rows["ensemble"]["n"] == 3
    before = {"nv_inference_request_success": 10.0, "nv_inference_compute_infer_duration_us": 1000.0}
    before["nv_inference_request_duration_us"] = 2000.0
    after = {"nv_inference_request_success": 26.0, "nv_inference_compute_infer_duration_us": 1800.0}
    after["nv_inference_request_duration_us"] = 3600.0
    post = repo_bench.post_row(16, 32, 2, 30, 0.5, before, after)
    assert post["compute_us_per_token"] == 25.0 and post["compute_us_per_call"] == 50.0
    assert post["postprocessing_calls"] == 16 and post["tokens_per_s"] == 32.0
    assert repo_bench.flat_ratio([post, {**post, "compute_us_per_token": 30.0}]) == pytest.approx(1.2)


def test_gateway_tables():
    samples = {"direct": [0.001, 0.002, 0.003], "gateway": [0.002, 0.004, 0.004]}
    rows = gateway_clients.table(samples, "direct")
    assert rows["gateway"]["added_p50_ms"] == pytest.approx(2.0)
    assert rows["gateway"]["paired_added_median_ms"] == pytest.approx(1.0) and rows["direct"]["n"] == 3
    r = gateway_bench.throughput_row(64, 128, (12800, 2.0, 0.5), (12800, 1.0, 0.25))
    assert r["tokens_per_gateway_cpu_s"] == 25600 and r["gateway_cores_busy"] == 0.25
    assert r["tokens_per_bare_grpc_cpu_s"] == 51200 and r["bare_grpc_tokens_per_wall_s"] == 12800
    got = {"direct": [0.001, 0.001], "A": [0.002, 0.003], "B": [0.0025, 0.0035]}
    lines = gateway_ab.paired_lines(got)
    assert lines[1] == "A       TTFT p50 2.500 ms, added over direct (paired) 1.500"
    assert lines[-1] == "B - A, paired median: 0.500 ms"


def test_selfcheck_truth_and_rows():
    assert selfcheck.within(104.0, 100.0) and not selfcheck.within(106.0, 100.0)
    assert selfcheck.within(1.9, 1.0)  # 1 ms at least
    rec = Record(start=0.0, sent=0.0, sent_ns=1_000_000_000)
    rec.times, rec.tokens = [0.2, 0.25, 0.3], [1, 1, 1]
    rec.emits_ns = [1_200_000_000, 1_250_000_000, 1_300_000_000]
    rec.end = 0.3
    assert selfcheck.truth(rec) == pytest.approx((200.0, 50.0))
    assert selfcheck.truth(Record(start=0.0, error="boom")) is None
    load = {"mode": "closed", "concurrency": 1, "requests": 1, "warmup": 0}
    line, good = selfcheck.level_row(Run([rec], 1.0, 0.01, "output_ids", load), 1, 3)
    assert good and line.startswith("| 1 | 1 | 0 | 200.00 | 200.00 | +0.00 | 50.00 | 50.00 | +0.00 |")
    line, good = selfcheck.level_row(Run([rec], 1.0, 0.01, "output_ids", load), 1, 4)  # a short answer
    assert not good and line.endswith("| MISS |")


def test_quantize_bench_figures(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "manifest.json").write_bytes(b"{}")
    assert tree_bytes(tmp_path) == {"hf": 10, ".": 2}
    assert above_start(5.0, {"start": {"allocated": 1.5, "peak": 1.5}}) == 3.5
    assert above_start(None, {"start": {"allocated": 1.5}}) is None and above_start(5.0, {}) is None


def test_a_script_prints_one_line_for_bad_input(capsys):
    def bad(args):
        raise UsageError(f"--pin {args.pin}: give CPU numbers, e.g. 1 or 1-3 or 0,2")

    assert run_script(bad, argparse.Namespace(pin="x")) == 2
    assert capsys.readouterr().err == "--pin x: give CPU numbers, e.g. 1 or 1-3 or 0,2\n"
    assert run_script(lambda args: None, argparse.Namespace()) == 0
    assert run_script(lambda args: 1, argparse.Namespace()) == 1


def test_level_lists_are_parsed_once_with_a_one_line_error() -> None:
    """Every bench's --concurrency / --levels goes through options.parse_levels: '1,x' was a ValueError
    traceback in the scripts that split the list themselves."""
    from pipeline.bench.options import parse_levels
    from pipeline.errors import LpxError

    assert parse_levels("1, 4,16") == [1, 4, 16]
    with pytest.raises(LpxError, match=r"Bad --levels '1,x' - use a comma list"):
        parse_levels("1,x", "--levels")
    with pytest.raises(LpxError, match=r"Bad --concurrency '0' - every level must be >= 1"):
        parse_levels("0")
