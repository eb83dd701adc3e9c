"""Stage 1: quantize a Hugging Face checkpoint with ModelOpt and write the exports the target needs.

Output folder (each export only when `needed_exports` asks for it):
  state/     ModelOpt state + weights (mto.save) with the HF config and tokenizer: the `torch` target's input,
             and what `lpx eval` restores when a quality gate is set
  trtllm/    TensorRT-LLM checkpoint (config.json + rank{N}.safetensors, split for tp x pp): `engine` target
  hf/        ModelOpt unified HF checkpoint with the tokenizer: `llmapi` target
  tokenizer/ the tokenizer files (always; the `engine` target's repository reads them)
  quantize.log  what ModelOpt printed

Every export is cross-checked against the source config before the stage commits (pipeline/export_check.py);
the disk is checked before any work (`check_disk`), and a disk that fills while writing is a PipelineError.
"""

from __future__ import annotations

import contextlib
import errno
import io
import shutil
import time
import warnings
from pathlib import Path

from ...config import Config, Variant
from ...errors import PipelineError
from ...inspection.checkpoint import CheckpointInfo, copy_tokenizer
from ...progress import Reporter
from .calibration import CalibrationSet, batches
from .export_check import check_hf, check_trtllm
from .recipes import recipe

STATE_FILE = "modelopt_state.pth"
EXPORTS = ("hf", "state", "trtllm")
TARGET_EXPORTS = {
    "engine": ("trtllm",),
    "llmapi": ("hf",),
    "torch": ("state",),
}  # what each build target reads
TOKENIZER_DIR = "tokenizer"  # always written (a few MB): the engine target's repository reads it
SCRATCH_STATE = ".clean-copy-state"  # the state written only to restore a clean copy; removed before commit
DISK_MARGIN = 1.05  # headroom over plan's weight bytes: file headers, scales plan does not count
HF_EXPORT_UNSUPPORTED_KV = {
    "int8": "ModelOpt's unified HF export has no INT8 KV cache (FP8/NVFP4 only): "
    "no hf/ folder, so target llmapi cannot use this variant"
}
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


def load_model(cfg: Config, info: CheckpointInfo):
    from transformers import AutoModelForCausalLM

    try:
        return (
            AutoModelForCausalLM.from_pretrained(
                info.path,
                dtype=torch_dtype(cfg.build.dtype),
                trust_remote_code=cfg.model.trust_remote_code,
                use_safetensors=not info.pickle_only,
            )
            .to(device())
            .eval()
        )
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise PipelineError(
                f"{info.path} needs its own Python code to load; set model.trust_remote_code: true "
                "only if you trust its source"
            ) from None
        raise


def load_tokenizer(cfg: Config):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        cfg.model.tokenizer or cfg.model.checkpoint, trust_remote_code=cfg.model.trust_remote_code
    )


def run(
    cfg: Config,
    variant: Variant,
    info: CheckpointInfo,
    calset: CalibrationSet,
    out: Path,
    report: Reporter,
    exports: tuple[str, ...] | None = None,
) -> dict:
    """Quantize and write `exports` (default: all three) into `out`; see `needed_exports`."""
    import torch

    exports = tuple(sorted(exports or EXPORTS))
    q = variant.quantization
    quant_cfg = recipe(q)
    timings: dict[str, float] = {}
    notes: list[str] = []
    log = io.StringIO()
    if "hf" in exports and q.kv_cache in HF_EXPORT_UNSUPPORTED_KV:
        # ModelOpt 0.47's unified HF export accepts FP8/NVFP4 KV caches only; TensorRT-LLM's checkpoint has INT8.
        notes.append(HF_EXPORT_UNSUPPORTED_KV[q.kv_cache])
        exports = tuple(e for e in exports if e != "hf")
    # a clean copy is restored from the state file when both exports run (each rewrites the weights in place)
    scratch_state = "state" not in exports and {"trtllm", "hf"} <= set(exports)
    disk = check_disk(info, q.format, exports, out, cfg.model.name, variant.name, scratch_state)
    tokenizer = load_tokenizer(cfg)
    tok_src = cfg.model.tokenizer or cfg.model.checkpoint
    memory: dict[str, dict[str, float]] = {}
    host: dict[str, float] = {}
    t0 = time.perf_counter()
    model = load_model(cfg, info)
    timings["load_s"] = time.perf_counter() - t0
    gpu_memory("load", memory)
    host_memory("load", host)
    export_check: dict = {"fixed": [], "checked": []}
    where = f"variant '{variant.name}'"

    with (
        contextlib.redirect_stdout(log),
        warnings.catch_warnings(record=True) as caught,
        torch.inference_mode(False),
        disk_full_is_an_error(out),
    ):
        warnings.simplefilter("always")
        if quant_cfg is not None:
            import modelopt.torch.quantization as mtq

            samples = list(
                batches(tokenizer, calset.texts, cfg.calibration.seq_len, cfg.calibration.batch_size)
            )

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
            host_memory("calibrate", host)
        copy_tokenizer(tok_src, out / TOKENIZER_DIR)
        state = out / ("state" if "state" in exports else SCRATCH_STATE)
        if "state" in exports or scratch_state:
            timings.update(_save_state(model, state, tok_src))
            gpu_memory("save_state", memory)
            host_memory("save_state", host)
        if "trtllm" in exports:
            timings.update(_export_trtllm(cfg, info, model, out))
            gpu_memory("export_trtllm", memory)
            host_memory("export_trtllm", host)
            export_check["fixed"] += check_trtllm(info.config, out / "trtllm", where)
            export_check["checked"].append("trtllm")
        if "hf" in exports:
            if "trtllm" in exports:
                del (
                    model
                )  # the TRT-LLM export changed the weights: free this copy before restoring a clean one
                _release_memory()
                t0 = time.perf_counter()
                model, how = restore(state, cfg.build.dtype)
                timings["restore_s"] = time.perf_counter() - t0
                if scratch_state:  # restored: free its disk before the HF export writes (8B: 15 GiB)
                    shutil.rmtree(state, ignore_errors=True)
                notes.append(f"restore: {how}")
                gpu_memory("restore", memory)
                host_memory("restore", host)
            timings.update(_export_hf(cfg, variant, info, model, out, tok_src))
            gpu_memory("export_hf", memory)
            host_memory("export_hf", host)
            export_check["fixed"] += check_hf(info.config, out / "hf", where)
            export_check["checked"].append("hf")
        del model
        if scratch_state:
            shutil.rmtree(state, ignore_errors=True)
    _release_memory()
    for w in caught:
        log.write(f"warning: {w.category.__name__}: {w.message}\n")
    (out / "quantize.log").write_text(log.getvalue(), encoding="utf-8")
    return {
        "format": q.format,
        "kv_cache": q.kv_cache,
        "exclude": q.exclude,
        "recipe": quant_cfg,
        "device": device(),
        "calibration": {
            "source": calset.source,
            "sha256": calset.sha256,
            "samples": len(calset.texts),
            "seq_len": cfg.calibration.seq_len,
            "batch_size": cfg.calibration.batch_size,
        },
        "exports": sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != TOKENIZER_DIR),
        "export_check": export_check,
        "notes": notes,
        "disk": {
            **disk,
            "written_bytes": {
                p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                for p in out.iterdir()
                if p.is_dir()
            },
        },
        "host_peak_rss_gib": host,
        "timings": {k: round(v, 3) for k, v in timings.items()},
        **({"gpu_memory_gib": memory} if memory else {}),
    }


def needed_exports(cfg: Config, variant: Variant) -> tuple[str, ...]:
    """What the quantize stage writes: the build target's input, a quality gate's (the ModelOpt state that
    `lpx eval` restores) and whatever quantization.exports asks for."""
    need = set(TARGET_EXPORTS[cfg.build.target]) | set(variant.quantization.exports)
    if any(v is not None for v in cfg.quality_gate.model_dump().values()):
        need.add("state")
    return tuple(sorted(need))


def estimate_bytes(
    info: CheckpointInfo, fmt: str, exports: tuple[str, ...], scratch_state: bool = False
) -> dict:
    """Bytes each export will take, from `lpx plan`'s weight sizes (the state file holds bf16 weights)."""
    from ...inspection.plan import shape_from_config, weight_bytes

    shape = shape_from_config(info.config, info.path.name)
    quantized = weight_bytes(shape, fmt)["weight_bytes"]
    full = weight_bytes(shape, "none")["weight_bytes"]
    # TensorRT-LLM's checkpoint carries a tied lm_head as its own tensor (share_embedding_table false)
    tied_head = 2 * shape.vocab * shape.hidden if shape.tied_embeddings else 0
    sizes = {"trtllm": quantized + tied_head, "hf": quantized, "state": full}
    out = {e: int(sizes[e] * DISK_MARGIN) + (64 << 20) for e in exports}
    if scratch_state:
        out["state (temporary, for a clean copy)"] = int(full * DISK_MARGIN)
    return out


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (its nearest existing parent); one place to patch in tests."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(
    info: CheckpointInfo,
    fmt: str,
    exports: tuple[str, ...],
    out: Path,
    model: str,
    variant: str,
    scratch_state: bool = False,
) -> dict:
    """Refuse before any work when the disk that holds `out` cannot take the exports."""
    need = estimate_bytes(info, fmt, exports, scratch_state)
    total, free = sum(need.values()), free_bytes(out)
    if total > free:
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in need.items())
        raise PipelineError(
            f"Not enough disk for variant '{variant}' of {model}: its exports need about {total / 2**30:.2f} GiB "
            f"({parts}) but {out.parent} has {free / 2**30:.2f} GiB free - free space there, point LPX_HOME at a "
            "larger disk, or drop entries from quantization.exports"
        )
    return {"estimated_bytes": need, "free_bytes_before": free}


@contextlib.contextmanager
def disk_full_is_an_error(out: Path):
    """A disk that fills while writing becomes a PipelineError naming the folder and the free space (the runner's
    staging folder is then removed, so nothing that looks complete is left)."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        raise _disk_full(out, exc) from None
    except RuntimeError as exc:  # torch's zip writer: "unexpected pos ..." / "failed writing file"
        text = str(exc)
        if "unexpected pos" not in text and "PytorchStreamWriter failed" not in text:
            raise
        raise _disk_full(out, exc) from None


def _disk_full(out: Path, exc: Exception) -> PipelineError:
    try:
        free = f"{free_bytes(out) / 2**30:.2f} GiB free"
    except OSError:
        free = "free space unknown"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return PipelineError(
        f"The disk filled while writing the quantize exports into {out} ({free}; {first}) - "
        "nothing was kept; free space or point LPX_HOME at a larger disk, then re-run"
    )


def gpu_memory(phase: str, into: dict) -> None:
    """On CUDA, record after `phase` the GPU memory allocated now and the peak so far (GiB, by PyTorch's
    allocator; the peak is cumulative since the caller last reset it, so the phase where it jumps is the one
    that set it)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        into[phase] = {
            "allocated": round(torch.cuda.memory_allocated() / 2**30, 3),
            "peak": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        }


def host_memory(phase: str, into: dict) -> None:
    """Record after `phase` this process's peak resident memory so far (GiB; Linux reports KiB)."""
    import resource

    into[phase] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def _release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _save_state(model, state: Path, tok_src: Path) -> dict:
    """The ModelOpt state + weights, HF config and tokenizer: the torch target's input and the clean copy."""
    import modelopt.torch.opt as mto

    t0 = time.perf_counter()
    state.mkdir()
    mto.save(model, state / STATE_FILE)
    model.config.save_pretrained(state)
    copy_tokenizer(tok_src, state)
    return {"save_state_s": time.perf_counter() - t0}


def _export_trtllm(cfg: Config, info: CheckpointInfo, model, out: Path) -> dict:
    decoder = DECODERS.get(info.architecture)
    if decoder is None:
        raise PipelineError(
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


def _export_hf(cfg: Config, variant: Variant, info: CheckpointInfo, model, out: Path, tok_src: Path) -> dict:
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
    initialization (pipeline/restore.py). Returns (model, how it was built)."""
    from ...runtime.restore import restore_state

    return restore_state(state, state / STATE_FILE, torch_dtype(dtype), on or device())
