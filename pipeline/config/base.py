"""The base of every lpx.yaml section, and the limits its values are held to.

Every section is strict: an unknown key, a string where a number belongs ("8"), a boolean where an integer
belongs (`true` is not 1), a number where text belongs and a non-finite float (.inf, .nan) are refused. Paths
are the one exception: YAML gives them as strings. Each bounded integer carries the reason for its bound
(`limit`), which the error message repeats (messages.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic import Strict as StrictMode

INT32_MAX = 2**31 - 1
# Triton's ModelConfig.max_batch_size is int32; TensorRT-LLM's BuildConfig / executor limits are SizeType32
# (int32); the python models read the string parameters back as int32 tensors (INPUT lengths, max_tokens).
INT32 = "the largest int32: Triton's config.pbtxt and TensorRT-LLM read it as a 32-bit integer"
COUNT = "the largest 32-bit count LPX accepts"
PORT_MAX = 65535
PORT = "the highest TCP port; 0 picks a free one"
HOUR, DAY, WEEK = 3600, 86400, 7 * 86400
MAX_GPUS = 1024
GPUS = "far past any one NVLink domain (a GB200 NVL72 has 72 GPUs)"
# Names become path components: $LPX_HOME/artifacts/<kind>/<model>/<variant>/..., and the longest file name
# LPX builds from them is logs/triton-<model>-<variant>.log: 12 bytes of its own + 2 x 100 = 212, below the
# 255 bytes per name (NAME_MAX) of ext4, xfs, btrfs and overlayfs. NAME_RE is ASCII only: bytes = characters.
NAME_MAX = 100
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NAME = "it becomes folder and file names under $LPX_HOME: 255 bytes at most per name, with LPX's own 12"
PATH_MAX = 4096  # Linux's PATH_MAX, bytes


class Strict(BaseModel):
    """Unknown keys are errors; values are not coerced (strict); assignments are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


def _path_ok(p: Path) -> Path:
    text = str(p)
    if "\x00" in text:
        raise ValueError("contains a NUL character (\\0) - remove it; no file name can hold one")
    if len(text.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise ValueError(f"is longer than {PATH_MAX} bytes (Linux's PATH_MAX) - use a shorter path")
    return p


# A path: YAML gives a string, so this one type is not strict. NUL bytes and over-long paths are refused.
ConfigPath = Annotated[Path, StrictMode(False), AfterValidator(_path_ok)]


def name_field(**kw: Any) -> Any:
    """A name that becomes a path component and a Triton / served model name."""
    return Field(pattern=NAME_RE, max_length=NAME_MAX, json_schema_extra={"limit": NAME}, **kw)


def bounded(default: Any, *, le: float, limit: str, **kw: Any) -> Any:
    """A Field with an upper bound `le` and the reason for it (`limit`, repeated in the error message)."""
    return Field(default, le=le, json_schema_extra={"limit": limit}, **kw)


def port(default: int, **kw: Any) -> Any:
    return bounded(default, ge=0, le=PORT_MAX, limit=PORT, **kw)
