"""The quantize stage: quantize a Hugging Face checkpoint with ModelOpt and write the exports the build
target needs. This package owns the stage's key (`inputs`), its checks and its run:

  __init__.py      check / inputs / run, and which exports a target needs
  recipes.py       ModelOpt's recipe per format (ordered quantizer list) and the shape checks
  model_io.py      loading the checkpoint, saving the ModelOpt state, the TensorRT-LLM and HF exports
  integrity.py     every tensor loaded from the checkpoint (headers vs the meta model, loading info), none
                   NaN / inf, ModelOpt's NaN-amax assertion as a message
  source_config.py the numerics fields of the source HF config (rope, norms, ...) in one normalized form
  export_check.py  each export checked (and completed) against the source config before the stage commits
  resources.py     disk space before and while writing, host / GPU memory per phase

Output folder (each export only when `needed_exports` asks for it):
  state/     ModelOpt state + weights (mto.save) with the HF config and tokenizer: the `torch` target's input,
             and what `lpx eval` restores when a quality gate is set
  trtllm/    TensorRT-LLM checkpoint (config.json + rank{N}.safetensors, split for tp x pp): `engine` target
  hf/        ModelOpt unified HF checkpoint with the tokenizer: `llmapi` target
  tokenizer/ the tokenizer files (always; the `engine` target's repository reads them)
  quantize.log  what ModelOpt printed
"""

from __future__ import annotations

import contextlib
import io
import shutil
import time
import warnings
from pathlib import Path

from ... import toolchain
from ...cache_keys import code_fingerprint
from ...config import Config, Variant
from ...inspection.checkpoint import copy_tokenizer
from ..context import Context
from .export_check import check_hf, check_sliding_window, check_trtllm
from .integrity import calibration_error, check_before_loading, check_finite
from .model_io import (
    batches,
    device,
    export_hf,
    export_trtllm,
    load_model,
    load_tokenizer,
    release_memory,
    restore,
    save_state,
)
from .recipes import check_shapes, recipe
from .resources import check_disk, disk_full_is_an_error, gpu_memory, host_memory

# The modules whose code shapes this stage's output (their fingerprint is part of the key).
CODE = (
    "pipeline.stages.quantize",
    "pipeline.stages.quantize.model_io",
    "pipeline.stages.quantize.recipes",
    "pipeline.stages.quantize.source_config",
    "pipeline.stages.quantize.export_check",
    "pipeline.inspection.checkpoint",
    "pipeline.runtime.restore",
    "pipeline.texts",
)
TARGET_EXPORTS = {
    "engine": ("trtllm",),
    "llmapi": ("hf",),
    "torch": ("state",),
}  # what each build target reads
TOKENIZER_DIR = "tokenizer"  # always written (a few MB): the engine target's repository reads it
SCRATCH_STATE = ".clean-copy-state"  # the state written only to restore a clean copy; removed before commit
HF_EXPORT_UNSUPPORTED_KV = {
    "int8": "ModelOpt's unified HF export has no INT8 KV cache (FP8/NVFP4 only): "
    "no hf/ folder, so target llmapi cannot use this variant"
}


def needed_exports(cfg: Config, variant: Variant) -> tuple[str, ...]:
    """What the quantize stage writes: the build target's input, a quality gate's (the ModelOpt state that
    `lpx eval` restores) and whatever quantization.exports asks for."""
    need = set(TARGET_EXPORTS[cfg.build.target]) | set(variant.quantization.exports)
    if any(v is not None for v in cfg.quality_gate.model_dump().values()):
        need.add("state")
    return tuple(sorted(need))


def check(ctx: Context, variant: Variant) -> None:
    """Before any work: tp_size against the heads and the AWQ groups, and a sliding window the exports
    cannot express."""
    info, _ = ctx.checkpoint()
    where = f"variant '{variant.name}'"
    check_shapes(variant.quantization, info.config, ctx.cfg.build.tp_size, where)
    check_sliding_window(info.config, ctx.cfg.build.max_seq_len, where)


def inputs(ctx: Context, variant: Variant) -> dict:
    """The key's inputs: the checkpoint's content, the variant's quantization, the calibration samples,
    what the exports are written for, ModelOpt's toolchain and this stage's code."""
    cfg, b = ctx.cfg, ctx.cfg.build
    _, fingerprint = ctx.checkpoint()
    calset = ctx.texts("calibration")
    return {
        "checkpoint": fingerprint,
        "quantization": variant.quantization.model_dump(mode="json"),
        "calibration": {
            **cfg.calibration.model_dump(mode="json", exclude={"data"}),
            "data_sha256": calset.sha256,
        },
        "export": {
            "dtype": b.dtype,
            "tp_size": b.tp_size,
            "pp_size": b.pp_size,
            "exports": list(needed_exports(cfg, variant)),
        },
        "versions": toolchain.versions("torch", "transformers", "modelopt"),
        "code": code_fingerprint(CODE),
    }


def run(ctx: Context, variant: Variant, out: Path) -> dict:
    """Quantize and write the exports `needed_exports` names into `out`; returns the manifest's results."""
    cfg = ctx.cfg
    info, _ = ctx.checkpoint()
    calset = ctx.texts("calibration")
    exports = needed_exports(cfg, variant)
    import torch

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
    # before anything is loaded: the tokenizer's files, and the tensors against the model config.json describes
    notes.append(ctx.cached("integrity", lambda: check_before_loading(cfg, info)))
    disk = check_disk(info, q.format, exports, out, cfg.model.name, variant.name, scratch_state)
    tokenizer = load_tokenizer(cfg)
    tok_src = cfg.model.tokenizer or cfg.model.checkpoint
    memory: dict[str, dict[str, float]] = {}
    host: dict[str, float] = {}

    def measure(phase: str) -> None:
        gpu_memory(phase, memory)
        host_memory(phase, host)

    t0 = time.perf_counter()
    model = load_model(cfg, info)
    timings["load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    check_finite(model, info.path)  # NaN / inf weights refused, naming the tensor (integrity.py: cost)
    timings["finite_scan_s"] = time.perf_counter() - t0
    measure("load")
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
                with ctx.report.task(f"calibrating {variant.name}", total=len(samples)) as advance:
                    for ids, mask in samples:
                        with torch.no_grad():
                            m(input_ids=ids.to(device()), attention_mask=mask.to(device()))
                        advance()

            t0 = time.perf_counter()
            try:
                model = mtq.quantize(model, quant_cfg, forward_loop)
            except AssertionError as exc:
                nan = calibration_error(exc, variant.name, cfg.build.dtype)
                if nan is None:
                    raise
                raise nan from None
            timings["calibrate_s"] = time.perf_counter() - t0
            measure("calibrate")
        copy_tokenizer(tok_src, out / TOKENIZER_DIR)
        state = out / ("state" if "state" in exports else SCRATCH_STATE)
        if "state" in exports or scratch_state:
            timings.update(save_state(model, state, tok_src))
            measure("save_state")
        if "trtllm" in exports:
            timings.update(export_trtllm(cfg, info, model, out))
            measure("export_trtllm")
            export_check["fixed"] += check_trtllm(info.config, out / "trtllm", where)
            export_check["checked"].append("trtllm")
        if "hf" in exports:
            if "trtllm" in exports:
                # the TRT-LLM export changed the weights: free this copy before restoring a clean one
                del model
                release_memory()
                t0 = time.perf_counter()
                model, how = restore(state, cfg.build.dtype)
                timings["restore_s"] = time.perf_counter() - t0
                if scratch_state:  # restored: free its disk before the HF export writes (8B: 15 GiB)
                    shutil.rmtree(state, ignore_errors=True)
                notes.append(f"restore: {how}")
                measure("restore")
            timings.update(export_hf(cfg, variant, info, model, out, tok_src))
            measure("export_hf")
            export_check["fixed"] += check_hf(info.config, out / "hf", where)
            export_check["checked"].append("hf")
        del model
        if scratch_state:
            shutil.rmtree(state, ignore_errors=True)
    release_memory()
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
