"""Paired A/B of two gateway checkouts on one toy Triton (loopback), for changes smaller than the
run-to-run spread of scripts/bench_gateway.py on a shared machine.

Both gateways run at once, each from its own checkout (PYTHONPATH), against the same toy `tensorrt_llm`
(answers at once). TTFT: --rounds rounds of direct / A / B streamed 4-token requests, the order reversed
every other round; the paired median of B - A. Throughput: --concurrency streams of 128 tokens through A,
then B, twice: tokens per second of each gateway process's CPU.

    git worktree add --detach /tmp/base <commit>
    python scripts/bench_gateway_ab.py --a /tmp/base --b .
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.gateway_ab import run
from pipeline.bench.script import run_script


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (the reference)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--concurrency", default="64,256")
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
