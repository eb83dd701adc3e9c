"""The TensorRT-LLM lines LPX knows, in one table: what each line's checkpoints can hold, which contract
files describe it, which NGC Triton container carries it and what that container needs from the host.
`container` is the image LPX's Dockerfile is built on for the line (its ARG BASE_IMAGE default is the
container of the engine target's default line); pipeline/facts/images.py has every known tag's release,
tests/contracts/base_images.json their sources.

`contract` is the version key of the files in tests/contracts/ (trtllm_build_flags.json,
tensorrtllm_backend_models.json, trtllm_checkpoint.json): the build and repository stages look up their
per-version tables (flags, backend parameters, tensors) by it. A line without a contract is one
`lpx doctor` can check a machine against, but LPX does not build for (build.trtllm_version refuses it).
`evidence` says where the container / CUDA / driver figures come from ("verified" or "lead").
`engine`: whether LPX builds trtllm-build engines for the line (build.target engine). TensorRT-LLM
deprecated its TensorRT engine path in the 1.3 line (NVIDIA/TensorRT-LLM PR #11723, 2026-02-25:
DeprecationWarning on trtllm-build, convert_checkpoint.py and LLM(backend="tensorrt")) and removed it on
main afterwards (#15767 migration guide "PyTorch is now the sole execution backend", #15907 Triton C++
backend, #15918 BuildConfig / TrtLlmArgs / Builder, #16369 TensorRT in the C++ build): from 1.3 on,
LPX serves TensorRT-LLM through the LLM API's PyTorch backend only (build.target llmapi).
`llmapi_contract`: the file in tests/contracts/ that holds the line's LLM-API option names (the
llmapi target's options are checked against it).
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
    engine: bool = True  # LPX builds trtllm-build engines for it (build.target engine)
    llmapi_contract: str | None = None  # tests/contracts/ file of its LLM-API option names


_ALGOS_016 = frozenset({"FP8", "W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL", "INT8"})
# Sources for quant_algos: tests/contracts/trtllm_checkpoint.json (QuantAlgo.values_latest and
# v0.16.0_referenced_members); NVFP4 post-dates v0.16.0.
# 1.3: what the PyTorch backend serves, from NVIDIA/TensorRT-LLM docs/source/features/quantization.md
# (FP4, FP8 per tensor / block scaling / rowwise, FP8 KV cache, W4A16 / W4A8 AWQ and GPTQ; no INT8
# SmoothQuant and no INT8 KV cache): the TensorRT engine path that ran W8A8_SQ is deprecated in 1.3.
_ALGOS_13 = frozenset({"FP8", "NVFP4", "W4A16_AWQ", "W4A8_AWQ"})
LINES: dict[str, Line] = {
    line.name: line
    for line in (
        Line(
            name="1.3",
            release="1.3.0rc29",
            contract="latest",
            quant_algos=_ALGOS_13,
            llmapi=True,
            container="nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc<N>",
            cuda="13",
            min_driver=580,
            evidence="lead: docs published for 1.3.0rc7..1.3.0rc29 (nvidia.github.io/TensorRT-LLM/1.3.0rc29/); "
            "the 1.3.0rc images are nvcr.io/nvidia/tensorrt-llm/release:1.3.0rcN (1.3.0rc14 seen in use); "
            "CUDA 13 plumbing in 1.3.0rc16 (2026-05-26); a 1.3 Triton trtllm-python-py3 tag, the exact CUDA "
            "and the driver floor were not confirmed (CUDA 13 needs driver >= 580)",
            engine=False,
            llmapi_contract="trtllm_llmapi_options_1.3.json",
        ),
        Line(
            name="1.2",
            release="1.2.1",
            contract="latest",
            quant_algos=_ALGOS_016 | {"NVFP4"},
            llmapi=True,
            container="nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
            cuda="13.1.0",
            min_driver=580,
            evidence="verified: Triton's Release Compatibility Matrix (docs/introduction/compatibility.md, "
            "triton-inference-server/server r26.08 @ 6fa22ae0), trtllm-python-py3 26.07 (TRT-LLM 1.2.1, CUDA "
            "13.1.0.036, built with driver 590.44.01; 26.03 ships 1.2.0, 26.04-26.07 1.2.1); CUDA 13.x runs on "
            "driver >= 580 (CUDA minor version compatibility)",
            llmapi_contract="trtllm_llmapi_options.json",
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
            "may use R470/R525/R535/R545 forward compatibility); TRT-LLM 0.16.0: Triton's Release "
            "Compatibility Matrix, trtllm-python-py3 24.12",
        ),
    )
}
# The lines LPX builds engines and repositories for (build.trtllm_version's choices), newest first.
BUILD_LINES: tuple[str, ...] = tuple(name for name, line in LINES.items() if line.contract)
# The lines build.target engine (trtllm-build) and llmapi build for, newest first.
ENGINE_LINES: tuple[str, ...] = tuple(n for n in BUILD_LINES if LINES[n].engine)
LLMAPI_LINES: tuple[str, ...] = tuple(n for n in BUILD_LINES if LINES[n].llmapi)
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


def default_line(target: str) -> str:
    """build.trtllm_version when the config leaves it out: the newest line `target` builds for."""
    return (ENGINE_LINES if target == "engine" else LLMAPI_LINES if target == "llmapi" else BUILD_LINES)[0]


def target_refusal(target: str, version: str) -> str | None:
    """Why build.target cannot build for TensorRT-LLM `version` ("... - fix"), or None."""
    if target == "engine" and not LINES[version].engine:
        return (
            f"build.target engine (trtllm-build) is deprecated in TensorRT-LLM {version} and removed after it "
            f"(PyTorch is its sole execution backend) - use build.target: llmapi, or pin "
            f"build.trtllm_version: '{ENGINE_LINES[0]}' to keep building engines"
        )
    if target == "llmapi" and not LINES[version].llmapi:
        return (
            f"build.target llmapi needs TensorRT-LLM >= {LLMAPI_LINES[-1]} (the LLM API's PyTorch backend) - "
            f"set build.trtllm_version: '{LLMAPI_LINES[0]}', or use build.target: engine for TensorRT-LLM {version}"
        )
    return None


def newest_with(algo: str) -> str | None:
    """The newest line LPX builds trtllm-build engines for whose checkpoints know `algo`, or None."""
    return next((name for name in ENGINE_LINES if algo in LINES[name].quant_algos), None)
