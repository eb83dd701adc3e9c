#!/usr/bin/env python3
"""Decode speed of LPX's torch engine on this machine's GPU, against the decode roofline.

The engine runs in this process (no Triton: the GPU box has no tritonserver), fed by one thread per
concurrent request with synthetic prompts of exact length; each request's timeline goes through the
same metrics (`pipeline.bench.metrics`) and roofline (`pipeline.bench.roofline`) as `lpx bench`, so
TTFT/ITL/MBU mean what they mean there. The model is a ~1.1B Llama shape with random, seeded
weights, built through LPX's own stages (quantize: none, build: torch target).

  python scripts/bench_engine.py --concurrency 1,8,32 --out engine.json        # on the GPU box
  python scripts/bench_engine.py --shape tiny --concurrency 1,2 --requests 4 --gpu h200   # CPU smoke run
  python scripts/bench_engine.py --shape tiny --modes on,off --concurrency 1,8,32   # cost of batch invariance

--modes runs each level with the batch-invariant attention on (the default) and off (transformers'
packed paged|sdpa) on the same engine folder and prompts, and prints tokens/s side by side.

Run it from the repository root where `pipeline` imports: with the venv's python (`make setup`), or
as `PYTHONPATH=. python3 scripts/bench_engine.py ...` with a python that has no LPX installed (the GPU box).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.engine_bench import run
from pipeline.bench.script import run_script


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["1b", "tiny"], default="1b")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument(
        "--requests", type=int, default=0, help="Requests per level (default: 2 x concurrency, >= 4)."
    )
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument(
        "--gpu", help="GPU for the roofline (default: the one torch sees, if LPX's table knows it)."
    )
    ap.add_argument("--modes", default="on", help="Batch-invariant attention: on, off or on,off.")
    ap.add_argument("--out", type=Path)
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
