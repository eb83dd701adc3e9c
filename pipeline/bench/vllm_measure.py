"""What scripts/bench_vllm.py measures on each server: rounds of `lpx bench` (and of NVIDIA's AIPerf), their
table of medians over rounds, and with --trace the streamed requests whose hops pipeline/bench/trace_join.py
joins, beside vLLM's own server split by its /metrics histograms.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

from ..errors import StageFailed
from .options import parse_levels
from .server_metrics import mean_ms, vllm_histograms
from .trace_join import request_path, timeline, trace_table
from .vllm_servers import LPX, served_model

METRICS = (("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"))


def traced_requests(url: str, c: int, n: int, prompt: str, max_tokens: int) -> list[dict]:
    """`n` streamed completions, `c` at a time: per request its response id and each chunk's receipt
    (CLOCK_MONOTONIC, the trace's clock)."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit

    host = urlsplit(url)
    model = served_model(url)
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    )

    def one(_: int) -> dict:
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
        sent = time.monotonic()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        rid, chunks = None, []
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            rid = rid or doc.get("id")
            if any(choice.get("text") for choice in doc.get("choices", [])):
                chunks.append(time.monotonic())
        conn.close()
        return {"id": rid, "sent": sent, "chunks": chunks}

    with ThreadPoolExecutor(c) as pool:
        return list(pool.map(one, range(n)))


VLLM_OWN_LABELS = {
    "client": "TTFT (client)",
    "ttft": "vLLM's TTFT (API server: arrival -> first token)",
    "front": "client - vLLM's TTFT (HTTP, its front end before arrival, SSE)",
    "queue": "queued -> scheduled",
    "prefill": "scheduled -> first token (prefill)",
    "rest": "vLLM's TTFT - queue - prefill (API server <-> engine core)",
}


def vllm_own_path(url: str, levels: str, prompt: str, n: int = 0) -> str:
    """vLLM's own server, the same streamed requests: the client's TTFT against what vLLM's metrics say of
    its engine (means of the /metrics histograms over each level: its front end's TTFT, from the request's
    arrival in its API server to the first token's output there; queue and prefill times in its engine
    core), so the front end's share of TTFT is the difference."""
    wanted = parse_levels(levels, "--levels")
    traced_requests(url, 1, 2, prompt, 8)  # warm-up
    columns = []
    for c in wanted:
        before = vllm_histograms(url)
        done = traced_requests(url, c, n or max(2 * c, 4), prompt, 64)
        columns.append(vllm_own_column(done, mean_ms(before, vllm_histograms(url))))
    return vllm_own_table(wanted, columns)


def vllm_own_column(done: list[dict], mean: dict[str, float]) -> dict[str, float]:
    """One level's figures (VLLM_OWN_LABELS' keys, ms): the client's mean TTFT of `done` beside vLLM's
    histograms' means over the same requests (`mean`: ttft, queue, prefill)."""
    ttfts = [(r["chunks"][0] - r["sent"]) * 1000 for r in done if r["chunks"]]
    client = statistics.fmean(ttfts) if ttfts else float("nan")
    return {
        "client": client,
        "ttft": mean["ttft"],
        "front": client - mean["ttft"],
        "queue": mean["queue"],
        "prefill": mean["prefill"],
        "rest": mean["ttft"] - mean["queue"] - mean["prefill"],
    }


def vllm_own_table(levels: list[int], columns: list[dict[str, float]]) -> str:
    lines = ["| mean ms | " + " | ".join(f"c={c}" for c in levels) + " |", "|---" * (len(levels) + 1) + "|"]
    for key, label in VLLM_OWN_LABELS.items():
        lines.append(f"| {label} | " + " | ".join(f"{col[key]:.2f}" for col in columns) + " |")
    return "\n".join(lines)


def trace_run(url: str, folder: Path, levels: str, prompt: str, n: int = 0) -> str:
    from .. import trace

    spent, path = {}, {}
    wanted = parse_levels(levels, "--levels")
    traced_requests(url, 1, 2, prompt, 8)  # warm-up
    for c in wanted:
        done = traced_requests(url, c, n or max(2 * c, 4), prompt, 64)
        time.sleep(0.5)  # the hops' last lines reach their files
        records = trace.read(folder)
        spent[c], path[c] = timeline(records, done), request_path(records, done)
    return (
        trace_table(wanted, spent)
        + "\n\nThe request's path to its first token:\n\n"
        + trace_table(wanted, path, mean=True)
    )


def bench(url: str, out: Path, levels: str, requests: int, env: dict, tokenizer: Path) -> dict:
    argv = [str(LPX), "bench", "--api", "openai", "--endpoint", "completions", "--url", url]
    argv += ["--concurrency", levels, "--requests", str(requests), "--warmup", "2", "--out", str(out)]
    argv += ["--input-len", "128", "--output-len", "64", "--tokenizer", str(tokenizer)]
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def aiperf(exe: str, url: str, out: Path, levels: str, requests: int, tokenizer: Path) -> dict:
    """AIPerf at each level: a results.json of the shape `row` reads (its profile_export_aiperf.json
    figures: time_to_first_token / inter_token_latency p50, p99 in ms, output_token_throughput and
    request_throughput averages)."""
    results = []
    for c in parse_levels(levels, "--levels"):
        art = out / f"c{c}"
        argv = [exe, "profile", "-m", served_model(url), "--url", url, "--endpoint-type", "completions"]
        argv += ["--streaming", "--tokenizer", str(tokenizer), "--isl", "128", "--osl", "64"]
        argv += ["--request-count", str(requests), "--concurrency", str(c), "--warmup-request-count", "2"]
        argv += ["--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--ui-type", "none"]
        argv += ["--artifact-dir", str(art)]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        doc = json.loads(next(art.rglob("profile_export_aiperf.json")).read_text())
        results.append(aiperf_result(doc, c))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"results": results}, indent=1))
    return {"results": results}


def aiperf_result(doc: dict, c: int) -> dict:
    """One level's figures from AIPerf's profile_export_aiperf.json, in lpx bench's results.json shape."""
    for tag in ("time_to_first_token", "inter_token_latency"):
        if doc[tag].get("unit") != "ms":
            raise StageFailed(f"AIPerf reported {tag} in {doc[tag].get('unit')}, not ms - use AIPerf 0.13.0")
    return {
        "load": {"concurrency": c},
        "ttft_ms": doc["time_to_first_token"],
        "itl_ms": doc["inter_token_latency"],
        "output_tokens_per_s": doc["output_token_throughput"]["avg"],
        "requests_per_s": doc["request_throughput"]["avg"],
    }


def row(doc: dict) -> dict[int, dict[str, float]]:
    """concurrency -> the figures of one bench run (results.json's `results`, one per level)."""
    out = {}
    for r in doc["results"]:
        figures = {f"{m}_{q}": (r.get(f"{m}_ms") or {}).get(q) for m, q in METRICS}
        figures["tok_s"] = r["output_tokens_per_s"]
        figures["req_s"] = r["requests_per_s"]
        out[int(r["load"]["concurrency"])] = figures
    return out


def table(results: dict[str, list[dict]]) -> str:
    lines = [
        "| server | c | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | tok/s | req/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        rows = [row(r) for r in runs]
        for c in sorted(rows[0]):
            med = {}
            for key in rows[0][c]:
                vals = [r[c][key] for r in rows if c in r and r[c][key] is not None]
                med[key] = statistics.median(vals) if vals else float("nan")
            ms = {k: med[k] for k in med if k.startswith(("ttft", "itl"))}
            lines.append(
                f"| {name} | {c} | {ms['ttft_p50']:.1f} | {ms['ttft_p99']:.1f} | {ms['itl_p50']:.1f} | "
                f"{med['tok_s']:.0f} | {med['req_s']:.2f} |"
            )
    return "\n".join(lines)
