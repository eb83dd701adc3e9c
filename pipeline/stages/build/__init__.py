"""Stage 2: turn a quantized checkpoint into something a server can load, per target.

`torch`: LPX's reference engine folder - the ModelOpt state folder (hard-linked, not copied)
plus `lpx_engine.json` with the runtime limits. `engine` and `llmapi` need TensorRT-LLM.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ...artifacts import home, link_tree
from ...config import Config, Variant
from ...errors import PipelineError
from ...progress import Reporter
from ..evaluate import CUDA_ONLY
from ..quantize import STATE_FILE
from . import trtllm_build

ENGINE_FILE = "lpx_engine.json"
TOKENS_PER_BLOCK = 32


def timing_cache(cfg: Config, arch: str) -> Path:
    """One kernel-timing cache per GPU arch and TensorRT-LLM line, kept in the artifact store."""
    return home() / "artifacts" / "timing-cache" / f"{arch}-trtllm{cfg.build.trtllm_version}.cache"


def engine_command(
    cfg: Config, variant: Variant, checkpoint: Path, arch: str, out: Path
) -> tuple[list[str], dict]:
    q = variant.quantization
    return trtllm_build.compose(
        cfg,
        q.format,
        checkpoint / "trtllm",
        out,
        timing_cache(cfg, arch),
        cfg.build.trtllm_version,
        kv_cache=q.kv_cache,
    )


def run(
    cfg: Config, variant: Variant, checkpoint: Path, arch: str, out: Path, report: Reporter | None = None
) -> dict:
    target = cfg.build.target
    needs = {"engine": "trtllm/config.json", "torch": f"state/{STATE_FILE}"}.get(target)
    if needs and not (checkpoint / needs).is_file():
        raise PipelineError(
            f"The quantize artifact {checkpoint} has no {needs} (build.target {target} reads it) - "
            f"re-run 'lpx quantize' for variant '{variant.name}'"
        )
    if target == "engine":
        return _run_engine(cfg, variant, checkpoint, arch, out, report or Reporter())
    if target == "llmapi":
        from .llmapi import write_llmapi

        return write_llmapi(cfg, variant, checkpoint, out)
    fmt = variant.quantization.format
    if fmt in CUDA_ONLY and not _cuda():
        raise PipelineError(
            f"variant '{variant.name}': format '{fmt}' cannot run on the torch target without a CUDA "
            "GPU (ModelOpt simulates it on CUDA only) - build it for target engine/llmapi, or on a GPU"
        )
    nbytes = link_tree(checkpoint / "state", out)[1]
    b = cfg.build
    engine = {
        "target": "torch",
        "format": variant.quantization.format,
        "kv_cache": variant.quantization.kv_cache,
        "dtype": b.dtype,
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": b.max_num_tokens,
        "tokens_per_block": TOKENS_PER_BLOCK,
        "state_file": STATE_FILE,
    }
    (out / ENGINE_FILE).write_text(json.dumps(engine, indent=2) + "\n")
    return {"engine": engine, "bytes": nbytes}


def _run_engine(
    cfg: Config, variant: Variant, checkpoint: Path, arch: str, out: Path, report: Reporter
) -> dict:
    """trtllm-build as a child process: output to build.log, exit code checked, timeout enforced."""
    env = trtllm_build.engine_versions()
    if env.get("sm") and env["sm"] != arch:
        raise PipelineError(
            f"This machine's GPU is {env['sm']} ({env.get('gpu')}); an engine for {arch} must be built "
            f"on an {arch} GPU - run this build on a matching runner ('lpx matrix' lists the cells)"
        )
    if not env.get("sm"):
        report.warn("no NVIDIA GPU detected: trtllm-build needs one of the target architecture")
    argv, reasons = engine_command(cfg, variant, checkpoint, arch, out)
    cache = timing_cache(cfg, arch)
    cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        with report.task(f"trtllm-build {variant.name}/{arch}", total=None) as advance:
            seconds = trtllm_build.run_build(
                argv, out / "build.log", cfg.build.timeout_s, progress=lambda _line: advance(0)
            )
    except PipelineError as exc:  # the temporary folder goes away: keep its log where the user can read it
        kept = home() / "logs" / f"build-{cfg.model.name}-{variant.name}-{arch}.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        if (out / "build.log").is_file():
            shutil.copyfile(out / "build.log", kept)
        exc.message = exc.message.replace(str(out / "build.log"), str(kept))
        raise
    engine = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else None
    if engine is None or not list(out.glob("rank*.engine")):
        raise PipelineError(
            f"trtllm-build exited 0 but wrote no engine (config.json + rank*.engine) in {out} - "
            "see build.log",
            detail=(out / "build.log").read_text()[-4000:],
        )
    return {
        "command": argv,
        "reasons": reasons,
        "build_s": round(seconds, 3),
        "environment": env,
        "build_config": engine.get("build_config", {}),
        "engine_files": sorted(p.name for p in out.glob("rank*.engine")),
    }


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def read_engine(engine_dir: Path) -> dict:
    try:
        return json.loads((Path(engine_dir) / ENGINE_FILE).read_text())
    except (OSError, ValueError):
        raise PipelineError(
            f"{engine_dir} is not an LPX engine folder (no readable {ENGINE_FILE}) - run 'lpx build'"
        ) from None
