"""The artifact store: keyed, atomic, self-describing stage outputs.

Layout: $LPX_HOME/artifacts/<kind>/<model>/<variant>/<arch>/<key>/ with manifest.json written last.
A folder becomes visible only by an atomic rename of a complete temporary folder, so a stage
killed at any point leaves nothing that a later run takes as complete. An entry whose manifest
is missing, unreadable or for another key is a miss, never a crash. A staging folder
(`.tmp-<key>-<pid>`) records its process and that process's start time; `sweep` removes the ones whose
process is gone. Keys are pipeline/cache_keys.py's; what no config references any more, pipeline/gc.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .atomic import replace_folder
from .errors import disk_full, disk_full_cause

MANIFEST = "manifest.json"
OWNER = ".lpx-owner"  # in a staging folder: "<pid> <process start time>", so a reused pid is not taken for its owner
SCHEMA = 1
# stage name -> folder under artifacts/ ("tune": `lpx tune`'s cell measurements, pipeline/tune/cells.py)
KINDS = {"quantize": "checkpoints", "eval": "evals", "build": "engines", "repo": "repos", "tune": "tune"}


def home() -> Path:
    """Every piece of LPX state lives here; LPX_HOME moves all of it."""
    return Path(os.environ.get("LPX_HOME") or Path.home() / ".cache" / "lpx").expanduser()


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


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def readable(folder: Path) -> None:
    """Give every file and folder under `folder` the read (and, for folders, search) bits the umask allows.
    Writers that go through a private temporary file (transformers' and safetensors' model.safetensors is
    0600) would otherwise leave weights only their owner reads: a pod's uid 1000 could not load a repository
    CI packed or a PVC holds (found by running the vllm pod as the kubelet does). The files are LPX's own
    artifacts, or hard links to them."""
    grant = ~_umask()
    for p in [folder, *Path(folder).rglob("*")]:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        want = st.st_mode | ((0o555 if stat.S_ISDIR(st.st_mode) else 0o444) & grant)
        if want != st.st_mode:
            os.chmod(p, stat.S_IMODE(want))


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


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None (no such process, no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22), or None."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def owner_alive(pid: int, started: str | None = None) -> bool:
    """Whether the process that made a staging folder still runs: the pid exists, is not a zombie (killed
    but not yet reaped), and, where its start time was recorded, is the same process, not a later one
    that reuses its pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    fields = _proc_stat(pid)
    if fields is None:
        return True  # no /proc to ask: the pid exists
    if fields[0] in ("Z", "X"):
        return False
    return started is None or process_start(pid) in (None, started)


def staging_owner(folder: Path) -> tuple[int, str | None] | None:
    """(pid, start time) of the process that made a `.tmp-<key>-<pid>` folder; None for another name."""
    try:
        pid = int(folder.name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return None
    try:
        recorded = (folder / OWNER).read_text().split()
        started = recorded[1] if len(recorded) == 2 and int(recorded[0]) == pid else None
    except (OSError, ValueError):
        started = None
    return pid, started


def is_orphan(folder: Path) -> bool:
    """A staging folder whose process is gone (or is this process: its own staging ends with its step)."""
    owner = staging_owner(folder)
    if owner is None:
        return True
    pid, started = owner
    return pid == os.getpid() or pid <= 0 or not owner_alive(pid, started)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (hard links counted once per path, symlinks not followed)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


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
        return [
            a
            for stage, model, variant, arch, _ in self.slots()
            for a in self.entries(stage, model, variant, arch)
        ]

    def newest(self, stage: str, variant: str, model: str | None = None) -> list[Artifact]:
        """Complete artifacts of one stage and variant (of `model`, or any), newest first."""
        found = [
            a
            for a in self.all()
            if a.stage == stage
            and a.manifest.get("variant") == variant
            and (not model or a.manifest.get("model") == model)
        ]
        return sorted(found, key=lambda a: a.manifest.get("created", 0), reverse=True)

    @contextlib.contextmanager
    def lock(self, slot: Path) -> Iterator[None]:
        slot.mkdir(parents=True, exist_ok=True)
        with open(slot / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def sweep(self, slot: Path) -> list[Path]:
        """Remove the staging folders of runs that were killed (their process is gone); returns them.
        Called under the slot's lock, before every run of a stage, cached or not."""
        removed = [d for d in slot.glob(".tmp-*") if d.is_dir() and is_orphan(d)]
        for d in removed:
            shutil.rmtree(d, ignore_errors=True)
        return removed

    def slots(self) -> list[tuple[str, str, str, str, Path]]:
        """Every (stage, model, variant, arch, folder) slot that exists."""
        out = []
        for stage, kind in KINDS.items():
            base = self.root / kind
            if base.is_dir():
                for slot in sorted(p for p in base.glob("*/*/*") if p.is_dir()):
                    out.append((stage, *slot.relative_to(base).parts, slot))
        return out

    def commit(self, tmp: Path, final: Path, manifest: dict) -> Artifact:
        """Make every file readable as the umask allows, write the manifest last, then rename the whole
        folder into place."""
        manifest = {"schema": SCHEMA, **manifest, "key": final.name, "complete": True}
        (tmp / OWNER).unlink(missing_ok=True)
        readable(tmp)
        data = json.dumps(manifest, indent=2, sort_keys=False, ensure_ascii=False, default=str)
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            fh.write(data + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        # an incomplete or corrupt entry under the same key is replaced
        replace_folder(tmp, final, final.with_name(f".tmp-trash-{final.name}-{os.getpid()}"))
        return Artifact(final, manifest)

    @contextlib.contextmanager
    def staging(self, slot: Path, key: str) -> Iterator[Path]:
        """A fresh staging folder for `key`, removed when the step ends (a no-op after its commit). A disk
        that fills while the stage (or its child process) writes there becomes a DiskFull naming the slot,
        its free space and the fix; the half-written folder is removed all the same."""
        tmp = slot / f".tmp-{key}-{os.getpid()}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            (tmp / OWNER).write_text(f"{os.getpid()} {process_start(os.getpid()) or ''}".strip() + "\n")
            yield tmp
        except Exception as exc:
            cause = disk_full_cause(exc)
            if cause is None:
                raise
            stage = next((s for s, kind in KINDS.items() if self.root / kind in slot.parents), "a")
            raise disk_full(slot, cause, f"writing the {stage} stage's output") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
