"""Versions of the installed tools: the stages put those that write their output into their keys, and
every manifest records them all."""

from __future__ import annotations

import platform
from functools import cache
from importlib import metadata

from . import __version__

PACKAGES = {
    "torch": "torch",
    "transformers": "transformers",
    "modelopt": "nvidia-modelopt",
    "tensorrt_llm": "tensorrt_llm",
    "tritonclient": "tritonclient",
    "pytriton": "nvidia-pytriton",
}


@cache
def version(*names: str) -> str | None:
    """The installed version of the first of these distributions that is installed (LPX's short names
    above, or a distribution name), or None."""
    for name in names:
        try:
            return metadata.version(PACKAGES.get(name, name))
        except metadata.PackageNotFoundError:
            continue
    return None


def versions(*names: str) -> dict[str, str | None]:
    out = {n: version(n) for n in (names or tuple(PACKAGES))}
    out["lpx"] = __version__
    return out


def environment() -> dict[str, str]:
    return {"python": platform.python_version(), "machine": platform.machine(), "system": platform.system()}
