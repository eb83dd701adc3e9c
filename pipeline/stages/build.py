"""Stage 2: turn a quantized checkpoint into something a server can load, per target.

`torch`: LPX's reference engine folder - the ModelOpt state folder (hard-linked, not copied)
plus `lpx_engine.json` with the runtime limits. `engine` and `llmapi` need TensorRT-LLM.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..artifacts import link_tree
from ..config import Config, Variant
from ..errors import PipelineError
from .evaluate import CUDA_ONLY
from .quantize import STATE_FILE

ENGINE_FILE = "lpx_engine.json"
TOKENS_PER_BLOCK = 32


def run(cfg: Config, variant: Variant, checkpoint: Path, arch: str, out: Path) -> dict:
    target = cfg.build.target
    if target != "torch":
        raise PipelineError(
            f"build.target '{target}' needs TensorRT-LLM's build tools, which this LPX release does not drive yet - "
            "set build.target: torch to run the reference engine"
        )
    fmt = variant.quantization.format
    if fmt in CUDA_ONLY and not _cuda():
        raise PipelineError(f"variant '{variant.name}': format '{fmt}' cannot run on the torch target without a CUDA "
                            "GPU (ModelOpt simulates it on CUDA only) - build it for target engine/llmapi, or on a GPU")
    nbytes = link_tree(checkpoint / "state", out)[1]
    b = cfg.build
    engine = {
        "target": "torch", "format": variant.quantization.format, "kv_cache": variant.quantization.kv_cache,
        "dtype": b.dtype, "max_batch_size": b.max_batch_size, "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len, "max_num_tokens": b.max_num_tokens, "tokens_per_block": TOKENS_PER_BLOCK,
        "state_file": STATE_FILE,
    }
    (out / ENGINE_FILE).write_text(json.dumps(engine, indent=2) + "\n")
    return {"engine": engine, "bytes": nbytes}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def read_engine(engine_dir: Path) -> dict:
    try:
        return json.loads((Path(engine_dir) / ENGINE_FILE).read_text())
    except (OSError, ValueError):
        raise PipelineError(f"{engine_dir} is not an LPX engine folder (no readable {ENGINE_FILE}) - "
                            "run 'lpx build'") from None
