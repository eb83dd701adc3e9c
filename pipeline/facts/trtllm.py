"""The TensorRT-LLM lines LPX knows, in one table: what each line's checkpoints can hold, which contract
files describe it, which NGC Triton container carries it and what that container needs from the host.

`contract` is the version key of the files in tests/contracts/ (trtllm_build_flags.json,
tensorrtllm_backend_models.json, trtllm_checkpoint.json): the build and repository stages look up their
per-version tables (flags, backend parameters, tensors) by it. A line without a contract is one
`lpx doctor` can check a machine against, but LPX does not build for (build.trtllm_version refuses it).
`evidence` says where the container / CUDA / driver figures come from ("verified" or "lead").
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class Line:
    name: str  # build.trtllm_version / lpx doctor --trtllm: "1.2"
    release: str  # the TensorRT-LLM release of the container: "1.2.x"
    contract: str | None  # version key in tests/contracts/*.json; None: doctor-only
    quant_algos: frozenset[str]  # QuantAlgo values its checkpoints know (weights and KV cache)
    llmapi: bool  # has the LLM API's PyTorch backend (build.target llmapi)
    container: str
    cuda: str
    min_driver: int
    evidence: str


_ALGOS_016 = frozenset({"FP8", "W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL", "INT8"})
# Sources for quant_algos: tests/contracts/trtllm_checkpoint.json (QuantAlgo.values_latest and
# v0.16.0_referenced_members); NVFP4 post-dates v0.16.0.
LINES: dict[str, Line] = {
    line.name: line
    for line in (
        Line(
            name="1.2",
            release="1.2.x",
            contract="latest",
            quant_algos=_ALGOS_016 | {"NVFP4"},
            llmapi=True,
            container="nvcr.io/nvidia/tritonserver:<26.x>-trtllm-python-py3",
            cuda="13",
            min_driver=580,
            evidence="lead: the 1.2.x line builds against CUDA 13 (driver >= 580); container tag not checked",
        ),
        Line(
            name="1.1",
            release="1.1.0",
            contract=None,
            quant_algos=_ALGOS_016 | {"NVFP4"},
            llmapi=True,
            container="nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3",
            cuda="13.0.2",
            min_driver=580,
            evidence="verified: Triton docs, Release Compatibility Matrix, trtllm-python-py3 25.12 "
            "(TRT-LLM 1.1.0, CUDA 13.0.2.006, driver 580.95.05)",
        ),
        Line(
            name="0.16",
            release="0.16.0",
            contract="v0.16.0",
            quant_algos=_ALGOS_016,
            llmapi=False,
            container="nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3",
            cuda="12.6.3",
            min_driver=560,
            evidence="verified: Triton release notes 24.12 (CUDA 12.6.3, driver 560 or later; data-center GPUs "
            "may use R470/R525/R535/R545 forward compatibility); TRT-LLM 0.16.0 is a lead",
        ),
    )
}
# The lines LPX builds engines and repositories for (build.trtllm_version's choices), newest first.
BUILD_LINES: tuple[str, ...] = tuple(name for name, line in LINES.items() if line.contract)
# nvidia-pytriton wheel -> the tritonserver it bundles (seen on these machines)
PYTRITON_SERVER = {"0.7.0": "2.51"}


def line(version: str) -> Line:
    """The table entry of a line LPX builds for; a UsageError naming the choices otherwise."""
    found = LINES.get(version)
    if found is None or found.contract is None:
        raise UsageError(
            f"Unknown TensorRT-LLM version '{version}' - set build.trtllm_version to {' or '.join(BUILD_LINES)}"
        )
    return found


def contract_version(version: str) -> str:
    """'1.2' -> 'latest', '0.16' -> 'v0.16.0': the version key of the contract files."""
    return line(version).contract  # type: ignore[return-value]


def unknown_algo(fmt: str, kv_cache: str, version: str) -> str | None:
    """Why a TensorRT-LLM line cannot load this format / KV-cache type ("format 'x' (ALGO) is not known to
    TensorRT-LLM v"), or None."""
    from .formats import KV_ALGO, QUANT_ALGO

    for algo, what in ((QUANT_ALGO[fmt], f"format '{fmt}'"), (KV_ALGO[kv_cache], f"kv_cache '{kv_cache}'")):
        if algo and algo not in LINES[version].quant_algos:
            return f"{what} ({algo}) is not known to TensorRT-LLM {version}"
    return None


def newest_with(algo: str) -> str | None:
    """The newest line LPX builds for whose checkpoints know `algo`, or None."""
    return next((name for name in BUILD_LINES if algo in LINES[name].quant_algos), None)
