#!/usr/bin/env python3
"""Decode speed of the torch target on real engine folders, with and without its fast path (issue 33).

Each engine folder (as `lpx run --until build` writes it for `build.target: torch`) is served in this
process by TorchEngine, fed by one thread per concurrent request with seeded random prompts of exact
length, greedy, through the same metrics as `lpx bench` (pipeline.bench.metrics): output tok/s over the
level's wall time, TTFT p50. `--fast on,off` loads each engine with the fast path (torch_fast.py) and
with ModelOpt's live quantizers. `--generate CKPT` adds plain transformers `generate` on the checkpoint
(bf16, one request at a time, same prompts): the baseline the bf16 torch target is held to.

  python scripts/bench_torch.py bf16=ENGINE fp8=ENGINE --fast on,off --concurrency 1,8 \\
      --generate /work/models/smollm2-135m-instruct --out bench.json

Run it from the repository root where `pipeline` imports: with the venv's python (`make setup`), or
as `PYTHONPATH=. python3 scripts/bench_torch.py ...` with a python that has no LPX installed (the GPU box).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.script import run_script
from pipeline.bench.torch_bench import run


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engines", nargs="*", help="NAME=ENGINE_DIR, one per variant")
    ap.add_argument("--fast", default="on", help="on, off or on,off")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=0, help="Requests per level (default: max(3, c)).")
    ap.add_argument("--off-requests", type=int, default=0, help="Requests per level with --fast off.")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--generate", type=Path, help="Checkpoint for the plain `generate` baseline.")
    ap.add_argument("--out", type=Path)
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
