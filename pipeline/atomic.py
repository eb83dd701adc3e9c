"""Whole or not at all: `write_atomic` writes a file through a temporary sibling that is renamed over it,
so a reader (or a run killed part-way) sees the old file or the new one, never half of one. It imports
nothing of LPX, so any layer may use it. Folders are made whole the same way by the artifact store
(pipeline/artifacts.py: a staging folder renamed into place)."""

from __future__ import annotations

import os
from pathlib import Path


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
