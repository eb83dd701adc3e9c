"""The images a manifest names, each with its registry (issue 25, D13).

- Upstream images are written fully qualified, as their publishers name them: NVIDIA's on nvcr.io
  (Dynamo's runtimes, the Triton base in Dockerfile), Docker Hub's with docker.io/ (the fetch init
  container's curl). Nothing depends on a node's default registry or its search list.
- LPX's own images (Dockerfile, Dockerfile.slim, Dockerfile.vllm) are `deploy.image` / `slim_image` /
  `vllm_image` under `deploy.registry` (or `lpx deploy --registry`); an image that names a registry
  itself (`ghcr.io/me/lpx-slim:1.2`) is used as it is. `lpx deploy` prints every image it wrote.
- Every kustomization lists its images (kustomize `images:`, name -> newName + newTag), so an overlay
  moves one arch to another registry or tag by editing two lines, without touching the objects.
- An engine loads only in the TensorRT-LLM line it was built by: `engine_line_refusal` holds
  build.trtllm_version to the line of `deploy.image_base` (the base `deploy.image` was built on), and
  `dynamo_line_refusal` the llmapi target's line to the TensorRT-LLM of Dynamo's runtime image
  (pipeline/facts/images.py; tests/contracts/base_images.json has the sources).
"""

from __future__ import annotations

from typing import Any

from ..config import Config
from ..errors import UsageError
from ..facts import images as facts
from ..facts.trtllm import LINES

# LPX's image per build target's Triton container (the gateway sidecar always runs the slim image)
SERVER_IMAGE = {"torch": "slim_image", "engine": "image", "vllm": "vllm_image"}


def has_registry(image: str) -> bool:
    """Whether the reference names a registry host (a dot or a port in its first part, or localhost), as
    container runtimes decide it."""
    first, slash, _ = image.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def qualified(cfg: Config, image: str) -> str:
    return image if has_registry(image) else f"{cfg.deploy.registry.rstrip('/')}/{image}"


def slim(cfg: Config) -> str:
    return qualified(cfg, cfg.deploy.slim_image)


def server(cfg: Config) -> str:
    """The image of the Triton container for cfg.build.target."""
    field = SERVER_IMAGE.get(cfg.build.target)
    if field is None:
        raise UsageError(
            f"build.target {cfg.build.target} has no LPX serving image - use 'lpx deploy dynamo' for llmapi"
        )
    return qualified(cfg, getattr(cfg.deploy, field))


def split(image: str) -> tuple[str, str | None, str | None]:
    """'host:5000/a/b:1.2@sha256:...' -> ('host:5000/a/b', '1.2', 'sha256:...')."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest or None


def kustomize_images(images: list[str]) -> list[dict[str, Any]]:
    """kustomize `images:` entries that keep each image as written: the place to change one per overlay."""
    out = []
    for image in sorted(set(images)):
        name, tag, digest = split(image)
        entry: dict[str, Any] = {"name": name, "newName": name}
        if digest:
            entry["digest"] = digest
        elif tag:
            entry["newTag"] = tag
        out.append(entry)
    return out


def of(objects: list[dict[str, Any]]) -> list[str]:
    """Every container image in the objects (pod templates at any depth)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("image"), str) and ("name" in node or "command" in node or "args" in node):
                found.append(node["image"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(objects)
    return sorted(set(found))


def _unknown(what: str, image: str, want: str, example: str = "") -> str:
    return (
        f"{what} {image} is not an image LPX knows the TensorRT-LLM of (pipeline/facts/images.py): make sure it "
        f"ships TensorRT-LLM {want}{example}, or the model will not load"
    )


def engine_line_refusal(cfg: Config) -> tuple[str | None, str | None]:
    """build.target engine: (refusal, warning) for build.trtllm_version against the TensorRT-LLM line of
    deploy.image_base, the image deploy.image is built on. A known base of another line is refused with the
    fix; a base LPX has no figures for gets a warning."""
    if cfg.build.target != "engine":
        return None, None
    want, base = cfg.build.trtllm_version, cfg.deploy.image_base
    release = facts.triton_release(base)
    if release is None:
        return None, _unknown("deploy.image_base", base, want, f" (e.g. {LINES[want].container})")
    have = facts.release_line(release)
    if have == want:
        return None, None
    rebuild = LINES[want].container  # the one answer to "which image ships this line" (its warning's too)
    return (
        f"the engine is built for TensorRT-LLM {want} (build.trtllm_version) but deploy.image_base {base}, the "
        f"image deploy.image is built on, ships TensorRT-LLM {release}, which cannot load it - build "
        f"deploy.image with docker build --build-arg BASE_IMAGE={rebuild} and set deploy.image_base: {rebuild}, "
        f"or set build.trtllm_version: '{have}' and rebuild the engine",
        None,
    )


def dynamo_line_refusal(cfg: Config, image: str) -> tuple[str | None, str | None]:
    """build.target llmapi: (refusal, warning) for build.trtllm_version against the TensorRT-LLM release
    of Dynamo's runtime image `image` (its LLM-API options are written for that line)."""
    if cfg.build.target != "llmapi":
        return None, None
    want = cfg.build.trtllm_version
    release = facts.dynamo_release(image)
    if release is None:
        return None, _unknown("Dynamo's runtime image", image, want)
    have = facts.release_line(release)
    if have == want:
        return None, None
    return (
        f"build.trtllm_version {want} writes LLM-API options for TensorRT-LLM {want}, but Dynamo's runtime "
        f"image {image} ships TensorRT-LLM {release} - set build.trtllm_version: '{have}'",
        None,
    )
