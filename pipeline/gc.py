"""`lpx artifacts gc`: find the artifacts no config references any more, and remove them on request.

An artifact is referenced when a given config, as it is now, gives its slot (stage, model, variant,
arch) that key: the keys are computed the way a run computes them, without running anything
(Runner.referenced). Only the models the given configs name are looked at; a slot whose key cannot be
known yet (a repository whose engine does not exist) is kept whole. Staging folders of killed runs
(their process is gone) and folders without a valid manifest are removed too. Sizes count every file
of a folder, including files hard-linked from another artifact.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .artifacts import Store, is_orphan, read_manifest, tree_bytes


@dataclass
class Candidate:
    path: Path
    slot: Path
    label: str  # "build tiny/fp8/sm90 3f2a9c1e04b7"
    reason: str
    size: int


@dataclass
class Plan:
    candidates: list[Candidate] = field(default_factory=list)
    kept: int = 0
    undecided: list[Path] = field(default_factory=list)  # slots kept whole: their key cannot be known yet
    other_models: set[str] = field(default_factory=set)

    def lines(self) -> list[str]:
        out = [f"{c.size / 2**20:10.1f} MiB  {c.label}  ({c.reason})  {c.path}" for c in self.candidates]
        total = sum(c.size for c in self.candidates)
        out.append(
            f"{len(self.candidates)} folder(s), {total / 2**30:.2f} GiB to remove; {self.kept} referenced "
            f"artifact(s) kept"
            + (f"; {len(self.undecided)} slot(s) kept whole (key not known yet)" if self.undecided else "")
            + (
                f"; artifacts of other models not looked at ({', '.join(sorted(self.other_models))})"
                if self.other_models
                else ""
            )
        )
        return out


def collect(config_paths: list[Path], store: Store | None = None) -> Plan:
    """What gc would remove for these configs (nothing is touched)."""
    from .config import load_config
    from .progress import Reporter
    from .runner import Runner

    store = store or Store()
    refs: dict[Path, set[str]] = {}
    undecided: set[Path] = set()
    models: set[str] = set()
    for path in config_paths:
        cfg = load_config(path)
        models.add(cfg.model.name)
        for slot, key in Runner(cfg, Reporter(), store=store).referenced().items():
            if key is None:
                undecided.add(slot)
            else:
                refs.setdefault(slot, set()).add(key)
    plan = Plan(undecided=sorted(undecided))
    for stage, model, variant, arch, slot in store.slots():
        if model not in models:
            plan.other_models.add(model)
            continue
        measured = store.slot("repo", model, variant, arch) if stage == "tune" else None  # its repository
        if slot in undecided or measured in undecided:
            continue
        for d in sorted(slot.iterdir()):
            if not d.is_dir():
                continue
            label = f"{stage} {model}/{variant}/{arch} {d.name}"
            if d.name.startswith(".tmp-"):
                if is_orphan(d):
                    plan.candidates.append(
                        Candidate(d, slot, label, "staging folder of a killed run", tree_bytes(d))
                    )
                continue
            if d.name.startswith("."):
                continue
            if d.name in refs.get(slot, ()) or (measured and _repo_of(d) in refs.get(measured, ())):
                plan.kept += 1
                continue
            if read_manifest(d) is None:
                reason = "incomplete: no valid manifest"
            elif measured:
                reason = f"measures repository {_repo_of(d)}, which no config references any more"
            elif slot in refs:
                reason = "no config gives this slot this key any more"
            else:
                reason = "no config has this variant / arch any more"
            plan.candidates.append(Candidate(d, slot, label, reason, tree_bytes(d)))
    return plan


def _repo_of(folder: Path) -> str | None:
    """The key of the repository an `lpx tune` cell measurement measured (None: not readable)."""
    m = read_manifest(folder)
    return (m.get("inputs") or {}).get("repo") if m else None


def remove(plan: Plan, store: Store | None = None) -> int:
    """Delete the plan's folders, each under its slot's lock, renamed out of sight first so that no
    half-deleted artifact ever looks complete; returns the bytes counted."""
    store = store or Store()
    freed = 0
    for c in plan.candidates:
        with store.lock(c.slot):
            if not c.path.exists() or (c.path.name.startswith(".tmp-") and not is_orphan(c.path)):
                continue
            trash = c.slot / f".tmp-trash-{c.path.name}-{os.getpid()}"
            os.rename(c.path, trash)
            shutil.rmtree(trash, ignore_errors=True)
            freed += c.size
    return freed
