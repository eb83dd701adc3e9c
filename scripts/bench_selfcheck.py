"""Check the load generator against a server that stamps its own answer times.

Starts a real tritonserver on the fixed-delay toy `tensorrt_llm` (first token after FIRST_MS, then one
every EVERY_MS; pipeline/bench/toy.py). The toy stamps each response with `emit_ns`, the server's
time.time_ns() right before the send; the client records time.time_ns() at send. Both run on this
machine, so they share a clock, and per request:
  TTFT truth = first emit - client send          ITL truth = mean gap between emits
The check: the client's TTFT and ITL (means) within 5% or 1 ms, whichever is larger, of the truth, at
every level. It also shows how far the server kept to its schedule (FIRST_MS / EVERY_MS), which is the
toy's accuracy, not the client's. Prints a table with the client's CPU use; exits 1 on a miss or a
failed request.

    PYTHONPATH=. python scripts/bench_selfcheck.py [--levels 1,16,64,256] [--protocol grpc]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.bench.load import LoadSpec, Record, run_closed
from pipeline.bench.metrics import request_metrics, summarize
from pipeline.bench.toy import write_toy_repo
from pipeline.servers.tritonserver import TritonServer


def within(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= max(0.05 * truth, 1.0)


def truth(rec: Record) -> tuple[float, float | None] | None:
    """(TTFT, ITL) in ms from the server's emit stamps; None when the server sent none."""
    if rec.error is not None or not rec.emits_ns or len(rec.emits_ns) != len(rec.times):
        return None
    ttft = (rec.emits_ns[0] - rec.sent_ns) / 1e6
    osl = int(sum(rec.tokens))
    itl = (rec.emits_ns[-1] - rec.emits_ns[0]) / 1e6 / (osl - 1) if osl > 1 else None
    return ttft, itl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    ap.add_argument("--first-ms", type=float, default=200.0)
    ap.add_argument("--every-ms", type=float, default=50.0)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--requests-per-level", type=int, default=0, help="default: 2 x level, at least 16")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_toy_repo(Path(tmp) / "repo", args.first_ms, args.every_ms)
        with TritonServer(repo, ready_timeout_s=60) as server:
            url = server.grpc_url if args.protocol == "grpc" else server.http_url
            spec = LoadSpec(
                url=url,
                model="tensorrt_llm",
                protocol=args.protocol,
                input_len=64,
                output_len=args.output_len,
            )
            print(
                f"cores: {os.cpu_count()}  schedule: TTFT {args.first_ms:.1f} ms, ITL {args.every_ms:.1f} ms, "
                f"OSL {args.output_len}  protocol: {args.protocol}  truth: server emit stamps"
            )
            print(
                "| conc | reqs | failed | TTFT client | TTFT truth | diff | ITL client | ITL truth | diff "
                "| TTFT p99 | ITL p99 | out tok/s | client CPU s | client CPU % | verdict |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for level in (int(x) for x in args.levels.split(",")):
                n = args.requests_per_level or max(16, 2 * level)
                run = run_closed(spec, level, n, warmup=min(level, 16))
                r = summarize(run)
                pairs = [
                    (m, t)
                    for m, t in ((request_metrics(x), truth(x)) for x in run.records)
                    if m is not None and t is not None
                ]
                if not r["ttft_ms"] or not r["itl_ms"] or len(pairs) != r["succeeded"]:
                    why = r["errors"][:1] or ["responses carry no emit_ns"]
                    print(
                        f"| {level} | {r['requests']} | {r['failed']} | - | - | - | - | - | - | - | - | - | - | - "
                        f"| FAIL {why} |"
                    )
                    ok = False
                    continue
                c_ttft = float(np.mean([m.ttft_ms for m, _ in pairs]))
                t_ttft = float(np.mean([t[0] for _, t in pairs]))
                c_itl = float(np.mean([m.itl_ms for m, _ in pairs if m.itl_ms is not None]))
                t_itl = float(np.mean([t[1] for _, t in pairs if t[1] is not None]))
                good = (
                    r["failed"] == 0
                    and within(c_ttft, t_ttft)
                    and within(c_itl, t_itl)
                    and r["osl"]["min"] == r["osl"]["max"] == args.output_len
                )
                ok &= good
                print(
                    f"| {level} | {r['requests']} | {r['failed']} | {c_ttft:.2f} | {t_ttft:.2f} | {c_ttft - t_ttft:+.2f} "
                    f"| {c_itl:.2f} | {t_itl:.2f} | {c_itl - t_itl:+.2f} | {r['ttft_ms']['p99']:.2f} "
                    f"| {r['itl_ms']['p99']:.2f} | {r['output_tokens_per_s']:.0f} | {r['client_cpu_s']:.2f} "
                    f"| {r['client_cpu_util']:.0%} | {'ok' if good else 'MISS'} |"
                )
    print("self-check passed" if ok else "self-check FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
