"""Whole or not at all: `write_atomic` writes a file through a temporary sibling that is renamed over it,
so a reader (or a run killed part-way) sees the old file or the new one, never half of one; `replace_folder`
puts a complete staging folder in the place of a folder the same way (the artifact store, `lpx deploy`'s
trees, the demo's and the examples' checkpoints). It imports nothing of LPX, so any layer may use it."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # renameat2(2): swap two paths in one step (Linux >= 3.15; not every filesystem)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where the kernel or the filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # no glibc renameat2 (musl before 1.2.5, other systems)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_folder(new: Path, dest: Path, aside: Path) -> None:
    """Put the complete folder `new` at `dest`; the old `dest`, if any, is removed after, never before. Where
    the filesystem can (renameat2's exchange: ext4, xfs, btrfs, tmpfs), the two change places in one step, so
    a reader or a run killed at any point finds the old folder or the new one at `dest`, never half of one.
    Elsewhere the old folder moves to `aside` (a hidden sibling; the artifact store's and the examples' sweeps
    remove those a killed run left), the new one takes its place, and the old one goes back if it cannot; a
    run killed between those two renames leaves no `dest` and the old folder at `aside`. `new` is gone when
    this returns."""
    new, dest, aside = Path(new), Path(dest), Path(aside)
    if not dest.exists():
        os.rename(new, dest)
        return
    if _exchange(new, dest):  # `new` now names the old folder
        shutil.rmtree(new, ignore_errors=True)
        return
    os.rename(dest, aside)
    try:
        os.rename(new, dest)
    except BaseException:
        os.rename(aside, dest)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def write_atomic(path: Path, data: str | bytes, encoding: str = "utf-8", mode: int = 0o644) -> Path:
    """Write `data` to `path` (parents created): a `.<name>.<pid>.tmp` sibling created with `mode` (0o600
    for a secret: it is never readable by others, not even for a moment), flushed to disk, then renamed over
    `path`; the temporary file is removed if anything fails. Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode(encoding) if isinstance(data, str) else data
    try:
        tmp.unlink(missing_ok=True)  # a leftover of a killed writer with this pid: O_EXCL below
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
