"""Check the load generator against a server whose answer times are known.

Starts a real tritonserver on a fixed-delay toy `tensorrt_llm` (first token after FIRST_MS, then one
every EVERY_MS; pipeline/bench/toy.py), runs closed-loop levels, and checks measured TTFT and ITL
(means) against the truth within 5% or 1 ms, whichever is larger. Prints a table with the client's
CPU use; exits 1 on a miss or a failed request.

    PYTHONPATH=. python scripts/bench_selfcheck.py [--levels 1,16,64,256] [--protocol grpc]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from pipeline.bench.load import LoadSpec, run_closed
from pipeline.bench.metrics import summarize
from pipeline.bench.toy import write_toy_repo
from pipeline.stages.serve import TritonServer


def within(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= max(0.05 * truth, 1.0)


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
            spec = LoadSpec(url=url, model="tensorrt_llm", protocol=args.protocol, input_len=64,
                            output_len=args.output_len)
            print(f"cores: {os.cpu_count()}  truth: TTFT {args.first_ms:.1f} ms, ITL {args.every_ms:.1f} ms, "
                  f"OSL {args.output_len}  protocol: {args.protocol}")
            print("| conc | reqs | failed | TTFT mean | TTFT p99 | ITL mean | ITL p99 | OSL | out tok/s "
                  "| client CPU s | client CPU % | verdict |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for level in (int(x) for x in args.levels.split(",")):
                n = args.requests_per_level or max(16, 2 * level)
                r = summarize(run_closed(spec, level, n, warmup=min(level, 16)))
                if not r["ttft_ms"] or not r["itl_ms"]:
                    print(f"| {level} | {r['requests']} | {r['failed']} | - | - | - | - | - | - | - | - | FAIL "
                          f"{r['errors'][:1]} |")
                    ok = False
                    continue
                ttft, itl = r["ttft_ms"], r["itl_ms"]
                good = (r["failed"] == 0 and within(ttft["mean"], args.first_ms) and within(itl["mean"], args.every_ms)
                        and r["osl"]["min"] == r["osl"]["max"] == args.output_len)
                ok &= good
                print(f"| {level} | {r['requests']} | {r['failed']} | {ttft['mean']:.2f} | {ttft['p99']:.2f} "
                      f"| {itl['mean']:.2f} | {itl['p99']:.2f} | {r['osl']['mean']:.0f} | {r['output_tokens_per_s']:.0f} "
                      f"| {r['client_cpu_s']:.2f} | {r['client_cpu_util']:.0%} | {'ok' if good else 'MISS'} |")
    print("self-check passed" if ok else "self-check FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
