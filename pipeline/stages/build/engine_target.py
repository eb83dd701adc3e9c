"""The `engine` target: `trtllm-build` on the quantize artifact's TensorRT-LLM checkpoint, one engine per
GPU architecture, with a kernel-timing cache kept per arch in the artifact store. The command line is
trtllm_build.py's, the child process trtllm_run.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ...artifacts import Artifact, home
from ...config import Config, Variant
from ...errors import LpxError, StageFailed
from ...progress import Reporter
from . import trtllm_build, trtllm_run


def timing_cache(cfg: Config, arch: str) -> Path:
    """One kernel-timing cache per GPU arch and TensorRT-LLM line, kept in the artifact store."""
    return home() / "artifacts" / "timing-cache" / f"{arch}-trtllm{cfg.build.trtllm_version}.cache"


def command(cfg: Config, variant: Variant, checkpoint: Path, arch: str, out: Path) -> tuple[list[str], dict]:
    """(argv, reason per flag) of the trtllm-build that writes this variant's engine for `arch` into `out`."""
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


def run(cfg: Config, variant: Variant, checkpoint: Artifact, arch: str, out: Path, report: Reporter) -> dict:
    """trtllm-build as a child process: output to build.log, exit code checked, timeout enforced."""
    env = trtllm_run.engine_versions()
    if env.get("sm") and env["sm"] != arch:
        raise LpxError(
            f"This machine's GPU is {env['sm']} ({env.get('gpu')}); an engine for {arch} must be built "
            f"on an {arch} GPU - run this build on a matching runner ('lpx matrix' lists the cells)"
        )
    if not env.get("sm"):
        report.warn("no NVIDIA GPU detected: trtllm-build needs one of the target architecture")
    argv, reasons = command(cfg, variant, checkpoint.path, arch, out)
    timing_cache(cfg, arch).parent.mkdir(parents=True, exist_ok=True)
    try:
        with report.task(f"trtllm-build {variant.name}/{arch}", total=None) as advance:
            seconds = trtllm_run.run_build(
                argv, out / "build.log", cfg.build.timeout_s, progress=lambda _line: advance(0)
            )
    except LpxError as exc:  # the temporary folder goes away: keep its log where the user can read it
        kept = home() / "logs" / f"build-{cfg.model.name}-{variant.name}-{arch}.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        if (out / "build.log").is_file():
            shutil.copyfile(out / "build.log", kept)
        exc.message = exc.message.replace(str(out / "build.log"), str(kept))
        raise
    engine = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else None
    if engine is None or not list(out.glob("rank*.engine")):
        raise StageFailed(
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
