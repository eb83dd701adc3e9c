"""Loading and writing models for the quantize stage: the source checkpoint, the ModelOpt state, the
TensorRT-LLM and unified HF exports, and the clean copy restored between two exports."""

from __future__ import annotations

import time
from pathlib import Path

from ...config import Config, Variant
from ...errors import LpxError, disk_full_cause
from ...inspection.checkpoint import CheckpointInfo, copy_tokenizer
from .integrity import check_loading_info

STATE_FILE = "modelopt_state.pth"
# TensorRT-LLM decoder names for ModelOpt's TRT-LLM export, by HF architecture
DECODERS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",
    "Qwen3ForCausalLM": "qwen",
    "Gemma2ForCausalLM": "gemma2",
    "Phi3ForCausalLM": "phi3",
}


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def calibration_dtype(cfg: Config, on: str) -> str:
    """The dtype a quantized variant is loaded and calibrated in on device `on`: calibration.dtype, where
    auto is build.dtype on a GPU and float32 on a CPU (measured on SmolLM2-135M, AMD EPYC AVX2, 2 cores:
    INT4 AWQ calibration 14.8 s per sample in bfloat16, 5.8 s in float32; docs/quality.md)."""
    chosen = cfg.calibration.dtype
    if chosen != "auto":
        return chosen
    return cfg.build.dtype if on == "cuda" else "float32"


def load_model(cfg: Config, info: CheckpointInfo, dtype: str | None = None):
    """The source model on this machine's device in `dtype` (default build.dtype), refused unless
    transformers loaded every tensor from the checkpoint (output_loading_info; integrity.py)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            info.path,
            dtype=torch_dtype(dtype or cfg.build.dtype),
            trust_remote_code=cfg.model.trust_remote_code,
            use_safetensors=not info.pickle_only,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported in the loading info (and refused there), naming the tensor
        )
    except (ValueError, OSError, RuntimeError, KeyError, SafetensorError) as exc:
        if "trust_remote_code" in str(exc):
            raise LpxError(
                f"{info.path} needs its own Python code to load; set model.trust_remote_code: true "
                "only if you trust its source"
            ) from None
        if "out of memory" in str(exc).lower() or disk_full_cause(exc) is not None:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise LpxError(
            f"model.checkpoint: transformers cannot load {info.path} ({type(exc).__name__}: {first}) - "
            "re-download the checkpoint, or use the config.json that came with these weights"
        ) from None
    check_loading_info(loading, info.path)
    return model.to(device()).eval()


def load_tokenizer(cfg: Config):
    """The tokenizer of model.tokenizer (else the checkpoint's), or a message naming its folder and the fix."""
    from transformers import AutoTokenizer

    folder = cfg.model.tokenizer or cfg.model.checkpoint
    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as exc:  # tokenizers' Rust errors are plain Exceptions
        if disk_full_cause(exc) is not None:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise LpxError(
            f"{'model.tokenizer' if cfg.model.tokenizer else 'model.checkpoint'}: transformers cannot load the "
            f"tokenizer in {folder} ({type(exc).__name__}: {first}) - tokenizer.json or tokenizer_config.json "
            "is damaged or from another library version: re-download the tokenizer files"
        ) from None


def batches(tokenizer, texts: list[str], seq_len: int, batch_size: int):
    """Tokenized batches (input_ids, attention_mask), each sample truncated to seq_len tokens."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[i : i + batch_size], return_tensors="pt", padding=True, truncation=True, max_length=seq_len
        )
        yield enc["input_ids"], enc["attention_mask"]


def release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def save_state(model, state: Path, tok_src: Path) -> dict:
    """The ModelOpt state + weights, HF config and tokenizer: the torch target's input and the clean copy."""
    import modelopt.torch.opt as mto

    t0 = time.perf_counter()
    state.mkdir()
    mto.save(model, state / STATE_FILE)
    model.config.save_pretrained(state)
    copy_tokenizer(tok_src, state)
    return {"save_state_s": time.perf_counter() - t0}


def export_trtllm(cfg: Config, info: CheckpointInfo, model, out: Path) -> dict:
    decoder = DECODERS.get(info.architecture)
    if decoder is None:
        raise LpxError(
            f"No TensorRT-LLM export for architecture {info.architecture}; "
            f"supported: {', '.join(sorted(DECODERS))}"
        )
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    t0 = time.perf_counter()
    export_tensorrt_llm_checkpoint(
        model,
        decoder,
        torch_dtype(cfg.build.dtype),
        out / "trtllm",
        inference_tensor_parallel=cfg.build.tp_size,
        inference_pipeline_parallel=cfg.build.pp_size,
    )
    return {"export_trtllm_s": time.perf_counter() - t0}


def export_hf(cfg: Config, variant: Variant, info: CheckpointInfo, model, out: Path, tok_src: Path) -> dict:
    from modelopt.torch.export import export_hf_checkpoint

    t0 = time.perf_counter()
    hf = out / "hf"
    if variant.quantization.format == "none":
        model.save_pretrained(hf, safe_serialization=True)
    else:
        if not getattr(model.config, "architectures", None):
            model.config.architectures = [info.architecture]
        export_hf_checkpoint(model, torch_dtype(cfg.build.dtype), hf)
    copy_tokenizer(tok_src, hf)
    return {"export_hf_s": time.perf_counter() - t0}


def restore(state: Path, dtype: str, on: str | None = None) -> tuple[object, str]:
    """Rebuild the quantized model from LPX's own state folder (config + ModelOpt state), with no weight
    initialization (pipeline/runtime/restore.py). Returns (model, how it was built)."""
    from ...runtime.restore import restore_state

    return restore_state(state, state / STATE_FILE, torch_dtype(dtype), on or device())
