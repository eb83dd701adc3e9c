"""Benchmark LPX's Triton repository on a real server (torch target, the demo's tiny model).

(a) Per-request overhead of `ensemble` (and `tensorrt_llm_bls`, when the repository has it) over a
    direct streamed call to `tensorrt_llm` with the same token ids: median and p90 latency over
    --requests requests of 16 output tokens, warm-up excluded, requests one at a time.
(b) Postprocessing CPU time per streamed token at 16, 256 and 1024 output tokens, from Triton's
    metrics endpoint (nv_inference_compute_infer_duration_us / nv_inference_request_duration_us
    and nv_inference_request_success of model `postprocessing`, read before and after). It must
    stay flat: postprocessing decodes each delta on its own (O(1) per token).

The engine is built for max_seq_len 2048 (max_input_len 512) so 1024 new tokens fit; end_id is set
to an id the model does not produce so every request runs to its max_tokens.

    .venv/bin/python scripts/bench_repo.py --out bench_repo.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.repo_bench import run
from pipeline.bench.script import run_script


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per request for (a)")
    ap.add_argument("--format", default="fp8", choices=["fp8", "none"])
    ap.add_argument(
        "--work", type=Path, default=None, help="folder for checkpoint/engine/repo (default: temp)"
    )
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
