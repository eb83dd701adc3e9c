"""The `vllm` build target: a folder vLLM (0.32) serves as it is, and LPX's Triton model runs
(pipeline/runtime/engines/vllm_engine.py).

    out/checkpoint/   the ModelOpt unified HF checkpoint + tokenizer (hard links into the quantize artifact):
                      bf16 weights for format none; FP8 / NVFP4 weights with hf_quant_config.json, which
                      vLLM's ModelOpt loader reads (quantization.quant_algo, kv_cache_quant_algo,
                      exclude_modules, group_size)
    out/lpx_vllm.json `model` (the folder above), `engine_args` (vLLM's EngineArgs by name, from cfg.build),
                      `cpu_engine_args` / `gpu_engine_args` (the KV-cache size: bytes on CPU, a memory share
                      on a GPU; the engine picks one when it starts), and what LPX checks (limits, format)

Every engine-argument name, and every hf_quant_config.json key and algorithm, is checked by the tests
against tests/contracts/vllm_engine_args.json (read from vLLM 0.32.0's arg_utils.py and modelopt.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...artifacts import link_tree
from ...config import Config, Variant
from ...errors import LpxError
from ...facts.formats import FORMATS, KV_CACHES
from ...runtime.engines.vllm_engine import MODEL_FILE

CHECKPOINT_DIR = "checkpoint"
VLLM_VERSION = "0.32.0"
GPU_MEMORY_UTILIZATION = 0.9  # the share of GPU memory vLLM takes (weights + KV cache), as llmapi's 0.9
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_bytes(cfg: Config, variant: Variant, model_config: dict) -> int:
    """KV-cache bytes for build.max_batch_size sequences of build.max_seq_len tokens (vLLM's CPU KV space)."""
    text = model_config.get("text_config") or model_config
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise LpxError(
            f"The checkpoint's config.json has no usable {exc} (layers, heads, head size size the KV "
            "cache vLLM gets on CPU) - fix config.json, or use build.target torch"
        ) from None
    per_value = 1 if variant.quantization.kv_cache == "fp8" else DTYPE_BYTES[cfg.build.dtype]
    b = cfg.build
    return 2 * layers * kv_heads * head_dim * per_value * b.max_seq_len * b.max_batch_size


def build_file(cfg: Config, variant: Variant, model_config: dict) -> dict:
    """The content of lpx_vllm.json (part of the build key)."""
    b, q = cfg.build, variant.quantization
    kv_dtype = q.kv_cache if KV_CACHES[q.kv_cache].quant_algo else "auto"  # vLLM's kv_cache_dtype
    engine_args: dict = {
        "dtype": b.dtype,
        "max_model_len": b.max_seq_len,
        "max_num_seqs": b.max_batch_size,
        "max_num_batched_tokens": max(b.max_num_tokens, b.max_seq_len),
        "tensor_parallel_size": b.tp_size,
        "pipeline_parallel_size": b.pp_size,
        "kv_cache_dtype": kv_dtype,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "trust_remote_code": cfg.model.trust_remote_code,
        "disable_log_stats": False,  # the scheduler's state feeds LPX's metric families
        "enforce_eager": b.eager,  # no torch.compile: a start in seconds, slower steps (build.eager)
    }
    if FORMATS[q.format].vllm_quantization:
        engine_args["quantization"] = FORMATS[q.format].vllm_quantization
    return {
        "model": CHECKPOINT_DIR,
        "vllm_version": VLLM_VERSION,
        "format": q.format,
        "kv_cache": q.kv_cache,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "engine_args": engine_args,
        "cpu_engine_args": {"kv_cache_memory_bytes": kv_bytes(cfg, variant, model_config)},
        "gpu_engine_args": {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION},
    }


def check_checkpoint(hf: Path, fmt: str, kv_cache: str, where: str) -> None:
    """The unified checkpoint against what vLLM's ModelOpt loader reads: no hf_quant_config.json for
    format none; for fp8 / nvfp4 the algorithm, the KV-cache algorithm and a list of excluded modules."""
    path = hf / "hf_quant_config.json"
    if FORMATS[fmt].vllm_quantization is None:
        if path.exists():
            raise LpxError(f"{where}: format none but {path} exists - re-run 'lpx quantize' for it")
        return
    try:
        quant = json.loads(path.read_text(encoding="utf-8"))["quantization"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LpxError(
            f"{where}: {path} is missing or has no 'quantization' section ({exc}); vLLM's ModelOpt loader "
            "reads it - re-run 'lpx quantize' for this variant"
        ) from None
    want = {"quant_algo": FORMATS[fmt].quant_algo, "kv_cache_quant_algo": KV_CACHES[kv_cache].quant_algo}
    got = {k: (str(quant.get(k)).upper() if quant.get(k) is not None else None) for k in want}
    if got != want or not isinstance(quant.get("exclude_modules", []), list):
        raise LpxError(
            f"{where}: {path} says {got}, exclude_modules {type(quant.get('exclude_modules')).__name__}; "
            f"vLLM's ModelOpt loader needs {want} and a list - re-run 'lpx quantize' for this variant"
        )


def write_vllm(cfg: Config, variant: Variant, checkpoint: Path, out: Path, model_config: dict) -> dict:
    """Write the vllm build folder `out` from the quantize artifact folder `checkpoint` (model_config: the
    source checkpoint's config.json, which the key was computed from)."""
    where = f"variant '{variant.name}'"
    hf = Path(checkpoint) / "hf"
    if not (hf / "config.json").is_file():
        raise LpxError(
            f"The quantize artifact {checkpoint} has no HF checkpoint (hf/config.json) - "
            f"re-run 'lpx quantize' for {where}"
        )
    q = variant.quantization
    check_checkpoint(hf, q.format, q.kv_cache, where)
    files, nbytes = link_tree(hf, Path(out) / CHECKPOINT_DIR)
    meta = build_file(cfg, variant, model_config)
    (Path(out) / MODEL_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return {"files": [CHECKPOINT_DIR, MODEL_FILE], "checkpoint_files": files, "bytes": nbytes, "vllm": meta}


def serve_command(out: Path, host: str = "127.0.0.1", port: int = 8000) -> list[str]:
    """vLLM's own OpenAI server on a vllm build folder (CPU arguments): the benchmark's reference."""
    meta = json.loads((Path(out) / MODEL_FILE).read_text(encoding="utf-8"))
    argv = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(Path(out) / meta["model"])]
    for name, value in {**meta["engine_args"], **meta["cpu_engine_args"]}.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # LPX's false values are vLLM's defaults; some flags have no --no- form
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return argv + ["--host", host, "--port", str(port)]
