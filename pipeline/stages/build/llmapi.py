"""The `llmapi` build target: a folder TensorRT-LLM's LLM API (PyTorch backend, >= 1.2) loads as is.

    out/checkpoint/          the ModelOpt unified HF checkpoint + tokenizer (hard links into the quantize artifact)
    out/llm_api_options.yaml extra LLM-API options (`trtllm-serve --extra_llm_api_options`, or LLM(**options))
    out/model.yaml           what LPX's Triton python model reads: backend, model, options, versions

Every option name is checked by the tests against tests/contracts/trtllm_llmapi_options.json
(names, types and defaults read from TensorRT-LLM's llm_args.py and commands/serve.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ...artifacts import link_tree
from ...config import Config, Variant
from ...errors import LpxError, UsageError
from ...facts.formats import refusal
from ...runtime.engines.llmapi_engine import MODEL_FILE, OPTIONS_FILE
from ..quantize.export_check import check_llmapi_options

CHECKPOINT_DIR = "checkpoint"
KV_FREE_GPU_MEMORY_FRACTION = 0.9


def cuda_graph_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two below max_batch_size, then max_batch_size itself (so max(batch_sizes) == max_batch_size)."""
    sizes, n = [], 1
    while n < max_batch_size:
        sizes.append(n)
        n *= 2
    return sizes + [max_batch_size]


def llmapi_options(cfg: Config, variant: Variant) -> dict:
    """The extra LLM-API options for one variant, from cfg.build."""
    b = cfg.build
    kv_cache_config: dict = {
        "free_gpu_memory_fraction": KV_FREE_GPU_MEMORY_FRACTION,
        "enable_block_reuse": True,
    }
    if variant.quantization.kv_cache == "fp8":
        kv_cache_config["dtype"] = "fp8"
    return {
        "tensor_parallel_size": b.tp_size,
        "pipeline_parallel_size": b.pp_size,
        "max_batch_size": b.max_batch_size,
        "max_num_tokens": b.max_num_tokens,
        "max_seq_len": b.max_seq_len,
        "max_input_len": b.max_input_len,
        "trust_remote_code": cfg.model.trust_remote_code,
        "enable_chunked_prefill": True,
        "kv_cache_config": kv_cache_config,
        # structured outputs / tool calls enforced wherever these options are served (LPX's Triton model,
        # trtllm-serve, Dynamo's TensorRT-LLM worker): TensorRT-LLM's xgrammar backend, the grammar engine
        # of the torch and vllm targets too (docs/gateway.md)
        "guided_decoding_backend": "xgrammar",
        "cuda_graph_config": {
            "batch_sizes": cuda_graph_batch_sizes(b.max_batch_size),
            "max_batch_size": b.max_batch_size,
            "enable_padding": True,
        },
    }


def model_file(cfg: Config, variant: Variant) -> dict:
    """The content of model.yaml: what LPX's Triton python model reads (part of the build key)."""
    q = variant.quantization
    return {
        "backend": "pytorch",
        "model": CHECKPOINT_DIR,
        "options": OPTIONS_FILE,
        "trtllm_version": cfg.build.trtllm_version,
        "format": q.format,
        "kv_cache": q.kv_cache,
    }


def _check(cfg: Config, variant: Variant, checkpoint: Path) -> Path:
    q = variant.quantization
    why = refusal(q.format, q.kv_cache, target="llmapi", line=cfg.build.trtllm_version)
    if why:  # the config refused it already; a config built in code is checked here
        raise UsageError(f"variant '{variant.name}': {why}")
    hf = Path(checkpoint) / "hf"
    if (hf / "config.json").is_file():
        return hf
    raise LpxError(
        f"The quantize artifact {checkpoint} has no HF checkpoint (hf/config.json) - "
        f"re-run 'lpx quantize' for variant '{variant.name}'"
    )


def write_llmapi(cfg: Config, variant: Variant, checkpoint: Path, out: Path) -> dict:
    """Write the llmapi build folder `out` from the quantize artifact folder `checkpoint`."""
    hf = _check(cfg, variant, checkpoint)
    out = Path(out)
    options = llmapi_options(cfg, variant)
    # the quantize stage checked hf/config.json against the source; these options must not contradict it
    check_llmapi_options(
        json.loads((hf / "config.json").read_text(encoding="utf-8")), options, f"variant '{variant.name}'"
    )
    files, nbytes = link_tree(hf, out / CHECKPOINT_DIR)
    (out / OPTIONS_FILE).write_text(yaml.safe_dump(options, sort_keys=False))
    model = model_file(cfg, variant)
    (out / MODEL_FILE).write_text(yaml.safe_dump(model, sort_keys=False))
    return {
        "files": [CHECKPOINT_DIR, OPTIONS_FILE, MODEL_FILE],
        "checkpoint_files": files,
        "bytes": nbytes,
        "options": options,
        "model": model,
    }


def serve_command(out: Path, host: str = "127.0.0.1", port: int = 8000) -> list[str]:
    """The `trtllm-serve` command that serves an llmapi build folder (OpenAI-compatible HTTP)."""
    out = Path(out)
    options = yaml.safe_load((out / OPTIONS_FILE).read_text()) or {}
    return [
        "trtllm-serve",
        str(out / CHECKPOINT_DIR),
        "--backend",
        "pytorch",
        "--extra_llm_api_options",
        str(out / OPTIONS_FILE),
        "--host",
        host,
        "--port",
        str(port),
        "--tp_size",
        str(options.get("tensor_parallel_size", 1)),
        "--pp_size",
        str(options.get("pipeline_parallel_size", 1)),
    ]
