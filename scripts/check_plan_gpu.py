#!/usr/bin/env python3
"""Hold `lpx plan` against a real GPU: allocate paged KV-cache pools (PyTorch tensors laid out as
TensorRT-LLM's: per layer [blocks, 2, kv_heads, tokens_per_block, head_dim]) and compare the bytes
the allocator hands out with the plan's figure (target: within 1%); then allocate the plan's
weights plus its fitting number of sequences and check they fit in the GPU's memory.

  python scripts/check_plan_gpu.py --preset llama-3.1-8b --gpu h200 --seq-len 8192 [--out result.json]

Run it from the repository root where `pipeline` imports: with the venv's python (`make setup`), or
as `PYTHONPATH=. python3 scripts/check_plan_gpu.py ...` with a python that has no LPX installed (the GPU box).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.plan_gpu import run
from pipeline.bench.script import run_script


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--format", default="fp8")
    ap.add_argument("--out", type=Path)
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
