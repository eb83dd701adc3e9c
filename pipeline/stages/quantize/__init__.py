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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import toolchain
from ...cache_keys import code_fingerprint
from ...config import Config, Variant
from ...facts.formats import KV_CACHES
from ...inspection.checkpoint import copy_tokenizer
from ..context import Context
from .export_check import check_hf, check_sliding_window, check_trtllm
from .integrity import calibration_error, check_before_loading, check_finite
from .model_io import (
    batches,
    calibration_dtype,
    device,
    export_hf,
    export_trtllm,
    load_model,
    load_tokenizer,
    release_memory,
    restore,
    save_state,
    torch_dtype,
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
    "vllm": ("hf",),
}  # what each build target reads
TOKENIZER_DIR = "tokenizer"  # always written (a few MB): the engine target's repository reads it
SCRATCH_STATE = ".clean-copy-state"  # the state written only to restore a clean copy; removed before commit


def needed_exports(cfg: Config, variant: Variant) -> tuple[str, ...]:
    """What the quantize stage writes: the input of every build target that this quantization is built
    for (the variants of the config that differ from `variant` only by target share one quantize artifact:
    same key, see Runner.step), a quality gate's (the ModelOpt state that `lpx eval` restores) and
    whatever quantization.exports asks for."""
    targets = {cfg.target_of(variant)} | {
        cfg.target_of(v) for v in cfg.variants if v.quantization == variant.quantization
    }
    need = {e for t in targets for e in TARGET_EXPORTS[t]} | set(variant.quantization.exports)
    if cfg.quality_gate.active():  # the defaults too: every quantized variant is evaluated
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


@dataclass
class _Run:
    """One run's state, shared by its phases. The model is held here only, so that a phase can free it
    (the TensorRT-LLM export's copy before a clean one is restored); the rest is what the manifest records."""

    ctx: Context
    variant: Variant
    out: Path
    info: Any
    exports: tuple[str, ...]
    scratch_state: bool = False
    dtype: str = ""  # the dtype the model was loaded (and calibrated) in
    model: Any = None
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    export_check: dict = field(default_factory=lambda: {"fixed": [], "checked": []})

    @property
    def where(self) -> str:
        return f"variant '{self.variant.name}'"

    @property
    def tok_src(self) -> str:
        return self.ctx.cfg.model.tokenizer or self.ctx.cfg.model.checkpoint

    def measure(self, phase: str) -> None:
        gpu_memory(phase, self.memory)
        host_memory(phase, self.host)


def run(ctx: Context, variant: Variant, out: Path) -> dict:
    """Quantize and write the exports `needed_exports` names into `out`; returns the manifest's results."""
    cfg = ctx.cfg
    info, _ = ctx.checkpoint()
    calset = ctx.texts("calibration")
    r = _Run(ctx, variant, out, info, needed_exports(cfg, variant))
    import torch

    quant_cfg = recipe(variant.quantization)
    log = io.StringIO()
    disk = _checks_and_disk(r)
    tokenizer = load_tokenizer(cfg)
    _load(r, quant_cfg is not None)
    with (
        contextlib.redirect_stdout(log),
        warnings.catch_warnings(record=True) as caught,
        torch.inference_mode(False),
        disk_full_is_an_error(out),
    ):
        warnings.simplefilter("always")
        if quant_cfg is not None:
            _calibrate(r, quant_cfg, tokenizer, calset)
            _to_build_dtype(r)
        _write_exports(r)
    release_memory()
    for w in caught:
        log.write(f"warning: {w.category.__name__}: {w.message}\n")
    (out / "quantize.log").write_text(log.getvalue(), encoding="utf-8")
    return _results(r, quant_cfg, calset, disk)


def _checks_and_disk(r: _Run) -> dict:
    """Drop the exports the KV cache rules out, decide on a scratch state, check the checkpoint's files
    before anything is loaded and the free disk; returns the disk check's figures."""
    cfg, q = r.ctx.cfg, r.variant.quantization
    kv = KV_CACHES[q.kv_cache]
    if "hf" in r.exports and not kv.hf_export:
        # ModelOpt 0.47's unified HF export accepts FP8/NVFP4 KV caches only; TensorRT-LLM's checkpoint has INT8.
        r.notes.append(
            f"ModelOpt's unified HF export has no {kv.quant_algo} KV cache (FP8/NVFP4 only): "
            "no hf/ folder, so target llmapi cannot use this variant"
        )
        r.exports = tuple(e for e in r.exports if e != "hf")
    # a clean copy is restored from the state file when both exports run (each rewrites the weights in place)
    r.scratch_state = "state" not in r.exports and {"trtllm", "hf"} <= set(r.exports)
    # before anything is loaded: the tokenizer's files, and the tensors against the model config.json describes
    r.notes.append(r.ctx.cached("integrity", lambda: check_before_loading(cfg, r.info)))
    return check_disk(r.info, q.format, r.exports, r.out, cfg.model.name, r.variant.name, r.scratch_state)


def _load(r: _Run, calibrates: bool) -> None:
    """Load the checkpoint (in the calibration dtype when it is calibrated) and refuse NaN / inf weights."""
    t0 = time.perf_counter()
    r.dtype = calibration_dtype(r.ctx.cfg, device()) if calibrates else r.ctx.cfg.build.dtype
    r.model = load_model(r.ctx.cfg, r.info, r.dtype)
    r.timings["load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    check_finite(r.model, r.info.path)  # NaN / inf weights refused, naming the tensor (integrity.py: cost)
    r.timings["finite_scan_s"] = time.perf_counter() - t0
    r.measure("load")


def _calibrate(r: _Run, quant_cfg: dict, tokenizer, calset) -> None:
    """ModelOpt's quantize with the calibration samples, reporting progress; a NaN amax becomes a message."""
    import modelopt.torch.quantization as mtq
    import torch

    cfg, name = r.ctx.cfg, r.variant.name
    samples = list(batches(tokenizer, calset.texts, cfg.calibration.seq_len, cfg.calibration.batch_size))

    def forward_loop(m):
        with r.ctx.report.task(f"calibrating {name}", total=len(samples)) as advance:
            for ids, mask in samples:
                with torch.no_grad():
                    m(input_ids=ids.to(device()), attention_mask=mask.to(device()))
                advance()

    t0 = time.perf_counter()
    try:
        r.model = mtq.quantize(r.model, quant_cfg, forward_loop)
    except AssertionError as exc:
        nan = calibration_error(exc, name, r.dtype)
        if nan is None:
            raise
        raise nan from None
    r.timings["calibrate_s"] = time.perf_counter() - t0
    r.measure("calibrate")


def _to_build_dtype(r: _Run) -> None:
    """A model calibrated in another dtype (calibration.dtype) is cast to build.dtype before any export,
    its config too: every export, and what the later stages read, is build.dtype's."""
    dtype = r.ctx.cfg.build.dtype
    if r.dtype != dtype:
        r.model = r.model.to(torch_dtype(dtype))
        r.model.config.dtype = torch_dtype(dtype)


def _write_exports(r: _Run) -> None:
    """The tokenizer, then each export in turn (state, trtllm, hf), each checked against the source config;
    the model is freed at the end and a scratch state removed."""
    cfg = r.ctx.cfg
    copy_tokenizer(r.tok_src, r.out / TOKENIZER_DIR)
    state = r.out / ("state" if "state" in r.exports else SCRATCH_STATE)
    if "state" in r.exports or r.scratch_state:
        r.timings.update(save_state(r.model, state, r.tok_src))
        r.measure("save_state")
    if "trtllm" in r.exports:
        r.timings.update(export_trtllm(cfg, r.info, r.model, r.out))
        r.measure("export_trtllm")
        _check_export(r, "trtllm", check_trtllm)
    if "hf" in r.exports:
        if "trtllm" in r.exports:
            _restore_clean_copy(r, state)
        r.timings.update(export_hf(cfg, r.variant, r.info, r.model, r.out, r.tok_src))
        r.measure("export_hf")
        _check_export(r, "hf", check_hf)
    r.model = None
    if r.scratch_state:
        shutil.rmtree(state, ignore_errors=True)


def _restore_clean_copy(r: _Run, state: Path) -> None:
    """The TRT-LLM export changed the weights: free this copy before restoring a clean one from `state`."""
    r.model = None
    release_memory()
    t0 = time.perf_counter()
    r.model, how = restore(state, r.ctx.cfg.build.dtype)
    r.timings["restore_s"] = time.perf_counter() - t0
    if r.scratch_state:  # restored: free its disk before the HF export writes (8B: 15 GiB)
        shutil.rmtree(state, ignore_errors=True)
    r.notes.append(f"restore: {how}")
    r.measure("restore")


def _check_export(r: _Run, name: str, check) -> None:
    """Check (and complete) the export `name` against the source config; the manifest records what was fixed."""
    r.export_check["fixed"] += check(r.info.config, r.out / name, r.where)
    r.export_check["checked"].append(name)


def _results(r: _Run, quant_cfg: dict | None, calset, disk: dict) -> dict:
    """The manifest's results: the recipe, the calibration set, the exports written and what the run recorded."""
    cfg, q, out = r.ctx.cfg, r.variant.quantization, r.out
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
            "dtype": r.dtype,
        },
        "exports": sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != TOKENIZER_DIR),
        "export_check": r.export_check,
        "notes": r.notes,
        "disk": {
            **disk,
            "written_bytes": {
                p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
                for p in out.iterdir()
                if p.is_dir()
            },
        },
        "host_peak_rss_gib": r.host,
        "timings": {k: round(v, 3) for k, v in r.timings.items()},
        **({"gpu_memory_gib": r.memory} if r.memory else {}),
    }
