"""Stage 1: quantize a Hugging Face checkpoint with ModelOpt and export it three ways.

Output folder:
  state/    ModelOpt state + weights (mto.save) with the HF config and tokenizer: the `torch` target's input
  trtllm/   TensorRT-LLM checkpoint (config.json + rank{N}.safetensors, split for tp x pp): `engine` target
  hf/       ModelOpt unified HF checkpoint with the tokenizer: `llmapi` target
  quantize.log  what ModelOpt printed
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from pathlib import Path

from ..calibration import CalibrationSet, batches
from ..checkpoint import CheckpointInfo, copy_tokenizer
from ..config import Config, Variant
from ..errors import PipelineError
from ..progress import Reporter
from ..recipes import recipe

STATE_FILE = "modelopt_state.pth"
HF_EXPORT_UNSUPPORTED_KV = {"int8": "ModelOpt's unified HF export has no INT8 KV cache (FP8/NVFP4 only): "
                                    "no hf/ folder, so target llmapi cannot use this variant"}
# TensorRT-LLM decoder names for ModelOpt's TRT-LLM export, by HF architecture
DECODERS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen",
            "Qwen3ForCausalLM": "qwen", "Gemma2ForCausalLM": "gemma2", "Phi3ForCausalLM": "phi3"}


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(cfg: Config, info: CheckpointInfo):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            info.path, dtype=torch_dtype(cfg.build.dtype), trust_remote_code=cfg.model.trust_remote_code,
            use_safetensors=not info.pickle_only,
        ).to(device()).eval()
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise PipelineError(f"{info.path} needs its own Python code to load; set model.trust_remote_code: true "
                                "only if you trust its source") from None
        raise


def load_tokenizer(cfg: Config):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.checkpoint,
                                         trust_remote_code=cfg.model.trust_remote_code)


def run(cfg: Config, variant: Variant, info: CheckpointInfo, calset: CalibrationSet, out: Path,
        report: Reporter) -> dict:
    import torch

    q = variant.quantization
    quant_cfg = recipe(q)
    timings: dict[str, float] = {}
    log = io.StringIO()
    tokenizer = load_tokenizer(cfg)
    tok_src = cfg.model.tokenizer or cfg.model.checkpoint
    memory: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    model = load_model(cfg, info)
    timings["load_s"] = time.perf_counter() - t0
    gpu_memory("load", memory)

    with contextlib.redirect_stdout(log), warnings.catch_warnings(record=True) as caught, torch.inference_mode(False):
        warnings.simplefilter("always")
        if quant_cfg is not None:
            import modelopt.torch.quantization as mtq

            samples = list(batches(tokenizer, calset.texts, cfg.calibration.seq_len, cfg.calibration.batch_size))

            def forward_loop(m):
                with report.task(f"calibrating {variant.name}", total=len(samples)) as advance:
                    for ids, mask in samples:
                        with torch.no_grad():
                            m(input_ids=ids.to(device()), attention_mask=mask.to(device()))
                        advance()

            t0 = time.perf_counter()
            model = mtq.quantize(model, quant_cfg, forward_loop)
            timings["calibrate_s"] = time.perf_counter() - t0
            gpu_memory("calibrate", memory)
        timings.update(_save_and_export_trtllm(cfg, info, model, out, tok_src))
        gpu_memory("export_trtllm", memory)
        del model  # both exports rewrite weights in place; free this copy before restoring a clean one
        _release_memory()
        timings.update(_export_hf(cfg, variant, info, out, tok_src))
        gpu_memory("export_hf", memory)
    for w in caught:
        log.write(f"warning: {w.category.__name__}: {w.message}\n")
    (out / "quantize.log").write_text(log.getvalue(), encoding="utf-8")
    return {
        "format": q.format, "kv_cache": q.kv_cache, "exclude": q.exclude,
        "recipe": quant_cfg, "device": device(),
        "calibration": {"source": calset.source, "sha256": calset.sha256, "samples": len(calset.texts),
                        "seq_len": cfg.calibration.seq_len, "batch_size": cfg.calibration.batch_size},
        "exports": sorted(p.name for p in out.iterdir() if p.is_dir()),
        "notes": [v for k, v in timings.items() if k.endswith("_skipped")],
        "timings": {k: round(v, 3) for k, v in timings.items() if not k.endswith("_skipped")},
        **({"gpu_memory_gib": memory} if memory else {}),
    }


def gpu_memory(phase: str, into: dict) -> None:
    """On CUDA, record after `phase` the GPU memory allocated now and the peak so far (GiB, by PyTorch's
    allocator; the peak is cumulative since the caller last reset it, so the phase where it jumps is the one
    that set it)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        into[phase] = {"allocated": round(torch.cuda.memory_allocated() / 2**30, 3),
                       "peak": round(torch.cuda.max_memory_allocated() / 2**30, 3)}


def _release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _save_and_export_trtllm(cfg: Config, info: CheckpointInfo, model, out: Path, tok_src: Path) -> dict:
    """Save the ModelOpt state first: both exports rewrite the model's weights in place."""
    import modelopt.torch.opt as mto

    timings = {}
    t0 = time.perf_counter()
    state = out / "state"
    state.mkdir()
    mto.save(model, state / STATE_FILE)
    model.config.save_pretrained(state)
    copy_tokenizer(tok_src, state)
    timings["save_state_s"] = time.perf_counter() - t0

    decoder = DECODERS.get(info.architecture)
    if decoder is None:
        raise PipelineError(f"No TensorRT-LLM export for architecture {info.architecture}; "
                            f"supported: {', '.join(sorted(DECODERS))}")
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    t0 = time.perf_counter()
    export_tensorrt_llm_checkpoint(model, decoder, torch_dtype(cfg.build.dtype), out / "trtllm",
                                   inference_tensor_parallel=cfg.build.tp_size,
                                   inference_pipeline_parallel=cfg.build.pp_size)
    timings["export_trtllm_s"] = time.perf_counter() - t0
    return timings


def _export_hf(cfg: Config, variant: Variant, info: CheckpointInfo, out: Path, tok_src: Path) -> dict:
    from modelopt.torch.export import export_hf_checkpoint

    timings: dict = {}
    state = out / "state"
    if variant.quantization.kv_cache in HF_EXPORT_UNSUPPORTED_KV:
        # ModelOpt 0.47's unified HF export accepts FP8/NVFP4 KV caches only; TensorRT-LLM's checkpoint has INT8.
        timings["export_hf_skipped"] = HF_EXPORT_UNSUPPORTED_KV[variant.quantization.kv_cache]
        return timings
    t0 = time.perf_counter()
    model = restore(state, cfg.build.dtype)  # a clean copy: the TRT-LLM export changed the weights
    hf = out / "hf"
    if variant.quantization.format == "none":
        model.save_pretrained(hf, safe_serialization=True)
    else:
        if not getattr(model.config, "architectures", None):
            model.config.architectures = [info.architecture]
        export_hf_checkpoint(model, torch_dtype(cfg.build.dtype), hf)
    copy_tokenizer(tok_src, hf)
    timings["export_hf_s"] = time.perf_counter() - t0
    return timings


def restore(state: Path, dtype: str, on: str | None = None):
    """Rebuild the quantized model from LPX's own state folder (config + ModelOpt state)."""
    import modelopt.torch.opt as mto
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(state), dtype=torch_dtype(dtype))
    model = model.to(on or device())
    with contextlib.redirect_stdout(io.StringIO()):  # ModelOpt prints one line per registered module
        mto.restore(model, state / STATE_FILE)
    return model.eval()
