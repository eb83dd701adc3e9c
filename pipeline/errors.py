"""The errors a user can fix. Each names the fix in its message; its class says the exit code, which the
CLI (pipeline/cli/) returns after printing the message - never a traceback.

    LpxError      1  anything the user can fix that is not one of the below
    UsageError    2  a bad flag, config value or input file: change what was passed
    ConfigError   2  lpx.yaml does not validate: one `path: message` line per problem
    NotFound      1  something LPX needs is missing: an artifact, a program, a running server
    StageFailed   1  a stage's tool or child process failed (trtllm-build, tritonserver, the quality gate)
    DiskFull      1  a write failed because its disk is full: names the folder, its free space and the fix

`disk_full_cause` recognizes a full disk in any exception (chained ones included), however the library
that wrote spells it; `disk_full` makes the error. The artifact store's staging (pipeline/artifacts.py),
the quantize stage and the CLI's last resort (pipeline/cli/) all use these two.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# How libraries report a full disk when they do not raise OSError(ENOSPC): torch's zip writer (torch.save,
# mto.save), safetensors' Rust writer (IoError ... StorageFull), a child process's log (strerror)
DISK_FULL_TEXTS = (
    "No space left on device",
    "Disk quota exceeded",
    "StorageFull",
    "unexpected pos",
    "PytorchStreamWriter failed",
)


class LpxError(Exception):
    """An error the user can fix. `message` names the fix; `detail` (e.g. a log tail) follows it."""

    exit_code = 1

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.detail = detail


class UsageError(LpxError):
    """A bad flag, config value or input: exit code 2."""

    exit_code = 2


class ConfigError(UsageError):
    """Invalid configuration: exit code 2, one line per problem."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(problems))


class NotFound(LpxError):
    """Something LPX needs does not exist (yet): an artifact, a program, a running server."""


class StageFailed(LpxError):
    """A stage's tool or child process failed, or its result is refused (the quality gate)."""


class DiskFull(LpxError):
    """A write failed because the disk that holds it is full (or over quota)."""


def disk_full_cause(exc: BaseException | None) -> BaseException | None:
    """The exception in `exc`'s chain (itself, its __cause__ / __context__, an LpxError's detail) that says
    the disk is full, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return None  # already reported as such
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        text = str(exc) + (f"\n{exc.detail}" if isinstance(exc, LpxError) and exc.detail else "")
        if any(t in text for t in DISK_FULL_TEXTS):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def free_space(folder: Path) -> str:
    """'1.23 GiB free' on the filesystem that holds `folder` (its nearest existing parent)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "free space unknown"
    return f"{free / 2**30:.2f} GiB free" if free >= 2**20 else f"{free / 2**10:.0f} KiB free"


def disk_full(folder: Path, cause: BaseException, what: str = "writing", kept: bool = True) -> DiskFull:
    """The error for a write into `folder` that found its disk full: the folder, its free space now, the
    library's own words (first line) and the fix (`kept`: the caller removed what was half-written)."""
    first = (str(cause).splitlines() or [type(cause).__name__])[0].strip() or type(cause).__name__
    if isinstance(cause, OSError) and cause.errno in DISK_FULL_ERRNOS and cause.strerror:
        first = cause.strerror
    return DiskFull(
        f"The disk filled while {what} into {folder} ({free_space(folder)} there now; {first}) - "
        + ("nothing was kept; " if kept else "")
        + "free space there or point LPX_HOME at a larger disk, then re-run",
        detail=cause.detail if isinstance(cause, LpxError) else None,
    )
