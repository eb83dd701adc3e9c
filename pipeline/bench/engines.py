"""Engines compared, as the field guide ends: every variant of one config measured alike, each on its own
build target (`variants[].build.target`), so the same quantized model is put on torch, vllm, llmapi and
engine side by side (`lpx compare -c`; `lpx tune`'s cells use `where_not` too). A variant whose target
cannot serve on this machine is kept in the table with the reason, and with what can still be said about
it here (its quality and its size on disk), never dropped.

  where_not      why a variant's target cannot serve here (no GPU, no TensorRT-LLM, no vLLM environment,
                 a format the platform has no kernels for), or None
  not_run        the record of such a variant: the stages it can still run here, and the reason
  measure_all    each variant benched in turn (served through the stage cache, stopped after)
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Config, Variant
from ..errors import LpxError
from ..facts.formats import FORMATS, LINE_TARGETS, refusal, sm_number
from .options import BenchOptions


def trtllm_present() -> bool:
    """TensorRT-LLM importable by the Triton stub: in this environment, or in $LPX_TRITON_PYTHONPATH."""
    from ..runtime.model_args import PATH_VARIABLE

    if importlib.util.find_spec("tensorrt_llm") is not None:
        return True
    folders = [f for f in os.environ.get(PATH_VARIABLE, "").split(os.pathsep) if f]
    return any((Path(f) / "tensorrt_llm").is_dir() for f in folders)


def where_not(cfg: Config, variant: Variant, gpu: Any = "detect") -> str | None:
    """Why `variant`'s target cannot serve on this machine, naming what it needs; None when it can.
    `gpu`: the GPU present (facts.gpu.GpuInfo) or None; detected unless given."""
    if gpu == "detect":
        from ..facts.gpu import detect_gpu

        gpu = detect_gpu()
    target = cfg.target_of(variant)
    fmt, kv = variant.quantization.format, variant.quantization.kv_cache
    if target in LINE_TARGETS:
        missing = [
            m
            for m, ok in (("no NVIDIA GPU", gpu is not None), ("no tensorrt_llm", trtllm_present()))
            if not ok
        ]
        if missing:
            return (
                f"target {target} serves on TensorRT-LLM: it needs an NVIDIA GPU and TensorRT-LLM (NVIDIA's "
                f"Triton TensorRT-LLM container); this machine has {' and '.join(missing)}"
            )
    if gpu is not None and target != "torch":
        why = refusal(fmt, kv, sm=sm_number(gpu.arch))
        if why:
            return f"{why}, and this GPU is {gpu.name} ({gpu.arch})"
    if target == "vllm":
        from ..runtime.engines.vllm_engine import find_python

        try:
            find_python()
        except LpxError as exc:
            return exc.message
    why = refusal(fmt, target=target, gpu=gpu is not None) if target in ("torch", "vllm") else None
    if why and target == "vllm":
        return f"{why}: format {fmt} on target vllm needs a GPU (sm{FORMATS[fmt].min_sm}+); on a CPU compare format none"
    if why:
        return f"{why}: target torch serves it on a GPU"
    return None


def not_run(cfg: Config, variant: Variant, why: str, report: Any = None) -> dict[str, Any]:
    """A variant that is not measured here: its reason, and what the stages can still make here (the
    quantized model and its quality; the build, for its size on disk, except trtllm-build engines)."""
    from ..progress import Reporter
    from ..runner import Runner

    record: dict[str, Any] = {
        "label": variant.name,
        "variant": {"model": cfg.model.name, "name": variant.name, "target": cfg.target_of(variant)},
        "not_run": why,
        "results": [],
    }
    runner = Runner(cfg, report or Reporter(), skip_gate=True)
    until = "eval" if cfg.target_of(variant) == "engine" else "build"
    try:
        outcome = runner.run([variant], until)[0]
    except LpxError as exc:
        record["not_run"] = f"{why}; and its stages failed here: {exc.message}"
        return record
    record["variant"]["artifact_keys"] = {k: a.key for k, a in outcome.artifacts.items()}
    built = [a for k, a in outcome.artifacts.items() if k.startswith("build:")]
    if built:
        record["variant"]["artifact"] = str(built[0].path)
    return record


def measure_all(
    cfg: Config, names: list[str], opts: BenchOptions, out: Path | None, echo: Callable[[str], Any] = print
) -> list[dict[str, Any]]:
    """Every chosen variant of the config (opts.config_path) benched with the same load, one after the
    other, each served on its own target and stopped; the others as `not_run` records. A variant whose
    stages or server fail is recorded with the failure, and the next one goes on."""
    from .sweep import measure

    docs = []
    for v in cfg.select(names or None):
        why = where_not(cfg, v)
        if why is None:
            echo(f"== {v.name}: target {cfg.target_of(v)}")
            try:
                docs.append(measure(opts.with_(variant_ref=v.name, out=out / v.name if out else None), echo))
                continue
            except LpxError as exc:
                why = f"failed: {exc.message}"
        echo(f"== {v.name}: target {cfg.target_of(v)} not measured here - {why}")
        docs.append(not_run(cfg, v, why))
    return docs
