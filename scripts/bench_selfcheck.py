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

    .venv/bin/python scripts/bench_selfcheck.py [--levels 1,16,64,256] [--protocol grpc]
"""

from __future__ import annotations

import argparse

from pipeline.bench.script import run_script
from pipeline.bench.selfcheck import run


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    ap.add_argument("--first-ms", type=float, default=200.0)
    ap.add_argument("--every-ms", type=float, default=50.0)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--requests-per-level", type=int, default=0, help="default: 2 x level, at least 16")
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
