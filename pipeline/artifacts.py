"""The artifact store: keyed, atomic, self-describing stage outputs.

Layout: $LPX_HOME/artifacts/<kind>/<model>/<variant>/<arch>/<key>/ with manifest.json written last.
A folder becomes visible only by an atomic rename of a complete temporary folder, so a stage
killed at any point leaves nothing that a later run takes as complete. An entry whose manifest
is missing, unreadable or for another key is a miss, never a crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import PipelineError

MANIFEST = "manifest.json"
SCHEMA = 1
# stage name -> folder under artifacts/
KINDS = {"quantize": "checkpoints", "eval": "evals", "build": "engines", "repo": "repos"}


def home() -> Path:
    """Every piece of LPX state lives here; LPX_HOME moves all of it."""
    return Path(os.environ.get("LPX_HOME") or Path.home() / ".cache" / "lpx").expanduser()


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def make_key(inputs: dict) -> str:
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()[:12]


def flatten(obj: object, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def diff_inputs(old: dict, new: dict) -> list[str]:
    a, b = flatten(old), flatten(new)
    changes = []
    for k in sorted(set(a) | set(b)):
        if a.get(k, "<unset>") != b.get(k, "<unset>"):
            changes.append(f"{k}: {_short(a.get(k, '<unset>'))} -> {_short(b.get(k, '<unset>'))}")
    return changes


def _short(v: object) -> str:
    s = canonical_json(v) if not isinstance(v, str) else v
    return s if len(s) <= 40 else s[:37] + "..."


def file_fingerprint(path: Path, content_limit: int = 64 << 20) -> dict[str, object]:
    """Identity of a file or folder: content hash of small files, size + mtime of large ones."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    out: dict[str, object] = {}
    for f in files:
        rel = f.name if f == path else str(f.relative_to(path))
        st = f.stat()
        if st.st_size <= content_limit:
            out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        else:
            out[rel] = f"size={st.st_size},mtime={st.st_mtime_ns}"
    return out


def link_tree(src: Path, dest: Path) -> tuple[int, int]:
    """Hard-link every file of src under dest (copy where linking fails, e.g. across filesystems).
    Artifacts are never modified in place, so sharing inodes between them is safe. Returns (files, bytes)."""
    files = nbytes = 0
    for f in sorted(Path(src).rglob("*")):
        if not f.is_file():
            continue
        target = dest / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f, target)
        except OSError:
            shutil.copy2(f, target)
        files += 1
        nbytes += f.stat().st_size
    return files, nbytes


@dataclass
class Artifact:
    path: Path
    manifest: dict

    @property
    def key(self) -> str:
        return self.manifest["key"]

    @property
    def stage(self) -> str:
        return self.manifest["stage"]


def read_manifest(folder: Path) -> dict | None:
    try:
        m = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(m, dict)
        or m.get("schema") != SCHEMA
        or m.get("key") != folder.name
        or not m.get("complete")
    ):
        return None
    return m


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    def __init__(self, root: Path | None = None):
        self.root = (root or home()) / "artifacts"

    def slot(self, stage: str, model: str, variant: str, arch: str) -> Path:
        return self.root / KINDS[stage] / model / variant / arch

    def lookup(self, stage: str, model: str, variant: str, arch: str, key: str) -> Artifact | None:
        folder = self.slot(stage, model, variant, arch) / key
        m = read_manifest(folder) if folder.is_dir() else None
        return Artifact(folder, m) if m else None

    def entries(self, stage: str, model: str, variant: str, arch: str) -> list[Artifact]:
        """Complete entries of one slot, newest first."""
        slot = self.slot(stage, model, variant, arch)
        found = []
        if slot.is_dir():
            for d in slot.iterdir():
                if d.is_dir() and not d.name.startswith("."):
                    m = read_manifest(d)
                    if m:
                        found.append(Artifact(d, m))
        return sorted(found, key=lambda a: a.manifest.get("created", 0), reverse=True)

    def all(self) -> list[Artifact]:
        out = []
        for stage, kind in KINDS.items():
            base = self.root / kind
            if not base.is_dir():
                continue
            for slot in sorted(p for p in base.glob("*/*/*") if p.is_dir()):
                model, variant, arch = slot.relative_to(base).parts
                out.extend(self.entries(stage, model, variant, arch))
        return out

    @contextlib.contextmanager
    def lock(self, slot: Path) -> Iterator[None]:
        slot.mkdir(parents=True, exist_ok=True)
        with open(slot / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def sweep(self, slot: Path) -> None:
        """Remove temporary folders left by killed runs (their owner pid is gone)."""
        for d in slot.glob(".tmp-*"):
            try:
                pid = int(d.name.rsplit("-", 1)[1])
            except (IndexError, ValueError):
                pid = -1
            if pid <= 0 or not _pid_alive(pid) or pid == os.getpid():
                shutil.rmtree(d, ignore_errors=True)

    def commit(self, tmp: Path, final: Path, manifest: dict) -> Artifact:
        """Write the manifest last, then rename the whole folder into place."""
        manifest = {"schema": SCHEMA, **manifest, "key": final.name, "complete": True}
        data = json.dumps(manifest, indent=2, sort_keys=False, ensure_ascii=False, default=str)
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            fh.write(data + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if final.exists():  # an incomplete or corrupt entry under the same key: replace it
            trash = final.with_name(f".tmp-trash-{final.name}-{os.getpid()}")
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        return Artifact(final, manifest)

    @contextlib.contextmanager
    def staging(self, slot: Path, key: str) -> Iterator[Path]:
        tmp = slot / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful commit


def require(art: Artifact | None, what: str, fix: str) -> Artifact:
    if art is None:
        raise PipelineError(f"No {what} - run '{fix}'")
    return art


def now() -> float:
    return time.time()
