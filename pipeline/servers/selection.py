"""Which engine this machine may serve: the GPU present (NVML, else nvidia-smi) against the arch and
TensorRT-LLM version each engine was built for. A mismatch is refused before Triton starts."""

from __future__ import annotations

import json

from ..artifacts import Artifact
from ..errors import LpxError
from ..facts.gpu import GpuInfo, detect_gpu
from ..toolchain import version


def engine_trtllm_version(engine: Artifact) -> str | None:
    """The TensorRT-LLM version that built an engine: its config.json, else the build manifest."""
    try:
        v = json.loads((engine.path / "config.json").read_text()).get("version")
    except (OSError, ValueError):
        v = None
    return v or engine.manifest.get("results", {}).get("environment", {}).get("tensorrt_llm")


def select(
    candidates: list[tuple[Artifact, Artifact]],
    gpu: GpuInfo | None,
    installed: str | None = None,
) -> tuple[Artifact, Artifact]:
    """From (engine, repository) pairs, the one built for this GPU's arch and this TensorRT-LLM."""
    if not candidates:
        raise LpxError("No engine built - run 'lpx build'")
    if all(e.manifest["arch"] == "any" for e, _ in candidates):  # torch target: runs anywhere
        return candidates[0]
    if gpu is None:
        archs = ", ".join(sorted(e.manifest["arch"] for e, _ in candidates))
        raise LpxError(
            f"No NVIDIA GPU found (NVML and nvidia-smi see none), so none of the engines "
            f"({archs}) can be served here - run 'lpx doctor', or serve on a GPU of one of those archs"
        )
    installed = installed if installed is not None else version("tensorrt_llm")
    same_arch = [(e, r) for e, r in candidates if e.manifest["arch"] == gpu.arch]
    if not same_arch:
        built = ", ".join(sorted(e.manifest["arch"] for e, _ in candidates))
        raise LpxError(
            f"This GPU is {gpu.name} ({gpu.arch}) but the engines were built for {built} - "
            f"add {gpu.arch} to build.archs and run 'lpx build' on a {gpu.arch} machine"
        )
    for e, r in same_arch:
        built_with = engine_trtllm_version(e)
        if installed is None or built_with is None or built_with == installed:
            return e, r
    e = same_arch[0][0]
    raise LpxError(
        f"The {gpu.arch} engine was built with TensorRT-LLM {engine_trtllm_version(e)} but this machine "
        f"has TensorRT-LLM {installed}; engines only load in the version that built them - "
        "rebuild with 'lpx build --force' here, or serve from a container with the same version"
    )


def choose(outcome) -> tuple[Artifact, Artifact] | None:
    """The (engine, repository) of a runner outcome to serve on this machine; None if it has no repository."""
    pairs = [
        (outcome.artifacts[f"build:{k[5:]}"], a)
        for k, a in outcome.artifacts.items()
        if k.startswith("repo:")
    ]
    if not pairs:
        return None
    gpu = None if all(e.manifest["arch"] == "any" for e, _ in pairs) else detect_gpu()
    return select(pairs, gpu)
