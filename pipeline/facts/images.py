"""The base images LPX builds on and deploys, and the TensorRT-LLM / vLLM each one carries.

tests/contracts/base_images.json holds every figure here with its upstream source (Triton's Release
Compatibility Matrix and build.py, Dynamo's release notes and container templates, docker-library's
python Dockerfile, Debian's base-passwd); tests/test_base_images.py holds this table, the Dockerfiles'
defaults and LPX's defaults (the engine line, Line.container) to it, so that an engine built by default
loads in the image deployed by default.

- `TRITON_TRTLLM`: NGC Triton `<tag>-trtllm-python-py3` -> the TensorRT-LLM release it ships, for the
  tags of the lines LPX builds for. LPX's engine image (Dockerfile) is built `FROM` one of them
  (`--build-arg BASE_IMAGE=...`); `deploy.image_base` names which, so `lpx deploy k8s` can refuse an
  engine whose line differs from the image's.
- `DYNAMO_RUNTIME`: the TensorRT-LLM / vLLM of Dynamo's runtime images per Dynamo release.
- Every one of these images has a user with uid 1000 except the python slim base: Triton's build.py
  creates `triton-server` (1000:1000) and asserts it, Dynamo's templates create `dynamo` (1000, group 0).
  LPX's Dockerfile therefore reuses uid 1000 whatever its name; Dockerfile.slim / .vllm create `lpx`.
"""

from __future__ import annotations

import re

from .trtllm import LINES, default_line

TRITON_REPO = "nvcr.io/nvidia/tritonserver"
TRITON_TRTLLM: dict[str, str] = {  # Triton release (NGC tag) -> TensorRT-LLM release
    "26.07": "1.2.1",
    "26.06": "1.2.1",
    "26.05": "1.2.1",
    "26.04": "1.2.1",
    "26.03": "1.2.0",
    "26.02": "1.1.0",
    "26.01": "1.1.0",
    "25.12": "1.1.0",
    "24.12": "0.16.0",
}
# the Dockerfile's ARG BASE_IMAGE: the container of the line build.target engine builds for by default
DOCKERFILE_BASE = LINES[default_line("engine")].container
# Dockerfile.slim's and Dockerfile.vllm's ARG PYTHON_IMAGE
PYTHON_BASE = "docker.io/library/python:3.11.11-slim-bookworm"
DYNAMO_RUNTIME: dict[str, dict[str, str]] = {  # Dynamo release -> engine -> release in its runtime image
    "1.6.1": {"tensorrtllm-runtime": "1.3.0rc29", "vllm-runtime": "0.31.0"},
    "1.5.0": {"tensorrtllm-runtime": "1.3.0rc25", "vllm-runtime": "0.28.0"},
}
_TRITON = re.compile(rf"^{re.escape(TRITON_REPO)}:(\d\d\.\d\d)-trtllm-python-py3$")
_DYNAMO = re.compile(r"^nvcr\.io/nvidia/ai-dynamo/(tensorrtllm-runtime|vllm-runtime):(.+)$")


def release_line(release: str) -> str | None:
    """'1.2.1' -> '1.2', '0.16.0' -> '0.16', '1.3.0rc25' -> '1.3': the line of LPX's table a TensorRT-LLM
    release belongs to, or None."""
    parts = release.split(".")
    name = ".".join(parts[:2])
    return name if len(parts) >= 2 and name in LINES else None


def triton_release(base: str) -> str | None:
    """The TensorRT-LLM release an NGC Triton trtllm-python-py3 image ships, or None when LPX does not
    know the image."""
    m = _TRITON.match(base)
    return TRITON_TRTLLM.get(m.group(1)) if m else None


def dynamo_release(image: str) -> str | None:
    """The engine release (TensorRT-LLM or vLLM) of a Dynamo runtime image, or None when unknown."""
    m = _DYNAMO.match(image)
    return DYNAMO_RUNTIME.get(m.group(2), {}).get(m.group(1)) if m else None
