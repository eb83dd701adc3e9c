"""Dynamo's vLLM worker for the vllm target: `python3 -m dynamo.vllm` with vLLM's engine arguments as flags.

Dynamo's vLLM worker adds vLLM's `AsyncEngineArgs` CLI to its own parser (components/src/dynamo/vllm/
args.py), so the engine arguments LPX's vllm build wrote (lpx_vllm.json: `engine_args` plus the GPU's
`gpu_engine_args`, every name checked against vLLM's EngineArgs in tests/contracts/vllm_engine_args.json)
become `--name-with-dashes value` flags, as vLLM's own server takes them. Disaggregated workers add
`--disaggregation-mode prefill|decode` and NIXL for the KV transfer, as Dynamo's examples
(examples/backends/vllm/deploy/disagg.yaml).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import UsageError
from ..runtime.engines.vllm_engine import MODEL_FILE, read_build

__all__ = ["MODEL_FILE", "engine_args", "flags", "worker_args"]

KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def engine_args(engine: Path) -> dict[str, Any]:
    """The vllm build's engine arguments for a GPU (engine_args + gpu_engine_args of lpx_vllm.json in a
    repository's tensorrt_llm/1/engine folder); the model is given as --model."""
    meta = read_build(engine)
    args = {**meta["engine_args"], **meta.get("gpu_engine_args", {})}
    args.pop("model", None)
    return args


def flags(args: dict[str, Any]) -> list[str]:
    """{'max_model_len': 2048, 'enable_prefix_caching': True} -> ['--max-model-len', '2048',
    '--enable-prefix-caching']; false booleans are left out (LPX's are vLLM's defaults)."""
    out: list[str] = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out += [flag] if value else []
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        elif value is not None:
            out += [flag, str(value)]
    return out


def worker_args(cfg: Config, phase: str, model_path: str, engine: dict[str, Any]) -> list[str]:
    """`python3 -m dynamo.vllm`'s arguments for one phase (worker, prefill, decode)."""
    if phase not in ("worker", "prefill", "decode"):
        raise UsageError(f"Dynamo worker phase {phase!r}: use worker, prefill or decode")
    args = ["--model", model_path, "--served-model-name", cfg.model.name, *flags(engine)]
    if phase != "worker":
        args += ["--disaggregation-mode", phase, *flags({"kv_transfer_config": KV_TRANSFER})]
    return args
