#!/usr/bin/env python3
"""Quantize a Llama-shaped model (random, seeded) in every format, twice: through LPX's
quantize stage and with bare ModelOpt calls doing the same work, and compare.

"The same work" is the exports LPX writes for --target (engine: the TensorRT-LLM checkpoint,
llmapi: the unified HF checkpoint, torch: the ModelOpt state) plus --exports. Bare ModelOpt follows
its plain recipe: with both the TensorRT-LLM and the HF export it restores a clean copy into a
`from_config` model (random init on the CPU); LPX restores on the meta device (no init).
Bare's outputs are deleted before LPX's run and LPX's after it is measured, so the disk holds the
checkpoint plus one run's exports at a time (8b: 15 GiB + at most ~32 GiB).

Prints, per format: calibration time, export time and peak GPU memory for both, the stage's
overhead in percent, and the bytes each export took on disk. Writes the figures as JSON with --out.

  python scripts/bench_quantize.py                 # ~1.1B (TinyLlama shape), on CUDA when present
  python scripts/bench_quantize.py --shape 8b --formats fp8 --target engine        # Llama-3.1-8B shape
  python scripts/bench_quantize.py --shape 8b --formats fp8 --exports hf           # + the restore path
  python scripts/bench_quantize.py --shape tiny    # a few MB, for a CPU smoke run

Run it from the repository root where `pipeline` imports: with the venv's python (`make setup`), or
as `PYTHONPATH=. python3 scripts/bench_quantize.py ...` with a python that has no LPX installed (the GPU box).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.quantize_compare import run
from pipeline.bench.script import run_script
from pipeline.bench.synthetic import ALL_FORMATS, SHAPES


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--formats", default=",".join(ALL_FORMATS))
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument(
        "--target",
        choices=["engine", "llmapi", "torch"],
        default="engine",
        help="build.target: decides the exports both runs write (default engine: the TensorRT-LLM checkpoint).",
    )
    ap.add_argument(
        "--exports",
        default="",
        help="Extra exports, as quantization.exports (comma list of trtllm,hf,state).",
    )
    ap.add_argument("--skip-bare", action="store_true", help="Only LPX's stage (saves device time).")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--workdir", type=Path, help="Scratch folder (default: /dev/shm, so disk speed is not measured)."
    )
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
