"""The `torch` target: LPX's reference engine folder - the ModelOpt state folder of the quantize artifact
(hard-linked, not copied) plus `lpx_engine.json`, the runtime limits the torch engine
(pipeline/runtime/engines/torch_engine.py) reads."""

from __future__ import annotations

import json
from pathlib import Path

from ...artifacts import Artifact, link_tree
from ...config import Config, Variant
from ...errors import LpxError
from ...facts.formats import refusal
from ...runtime.engines.torch_meta import META_FILE
from ..quantize.model_io import STATE_FILE

TOKENS_PER_BLOCK = 32  # LPX's KV-cache block size, the same for the engine target's trtllm-build


def engine_meta(cfg: Config, variant: Variant) -> dict:
    """The content of lpx_engine.json (part of the build key; the torch engine checks it with read_meta)."""
    b, q = cfg.build, variant.quantization
    return {
        "target": "torch",
        "format": q.format,
        "kv_cache": q.kv_cache,
        "dtype": b.dtype,
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": b.max_num_tokens,
        "tokens_per_block": TOKENS_PER_BLOCK,
        "state_file": STATE_FILE,
    }


def run(cfg: Config, variant: Variant, checkpoint: Artifact, out: Path) -> dict:
    fmt = variant.quantization.format
    why = refusal(fmt, target="torch", gpu=_cuda())
    if why:
        raise LpxError(
            f"variant '{variant.name}': {why}, so the torch target serves it on a CUDA GPU only - build it "
            "for target engine/llmapi, or on a GPU"
        )
    nbytes = link_tree(checkpoint.path / "state", out)[1]
    engine = engine_meta(cfg, variant)
    (out / META_FILE).write_text(json.dumps(engine, indent=2) + "\n")
    return {"engine": engine, "bytes": nbytes}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
