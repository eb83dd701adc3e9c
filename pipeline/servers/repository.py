"""Which repository to serve from a packaged folder, without lpx.yaml (`lpx serve --repo DIR`, the Kubernetes pods): DIR is
one repository (it holds ensemble/ and manifest.json), or an unpacked lpx-repos.tgz (scripts/ci/package.sh:
artifacts/repos/<model>/<variant>/<arch>/<key>/ as under LPX_HOME). The repository built for the GPU
present is chosen as for a configured serve (selection.py); a read-only DIR is fine: Triton and LPX only
read it."""

from __future__ import annotations

import json
from pathlib import Path

from ..artifacts import Artifact, read_manifest
from ..errors import NotFound, UsageError
from ..facts.gpu import detect_gpu
from .selection import select

ENGINE_DIR = Path("tensorrt_llm") / "1" / "engine"


def repositories(folder: Path) -> list[Artifact]:
    """Every complete repository artifact at or under `folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotFound(f"--repo {folder}: no such folder - pass a repository or an unpacked lpx-repos.tgz")
    candidates = [folder] if (folder / "manifest.json").is_file() else []
    candidates += [m.parent for m in sorted((folder / "artifacts" / "repos").glob("*/*/*/*/manifest.json"))]
    found = []
    for path in candidates:
        manifest = read_manifest(path)
        if manifest is not None and manifest.get("stage") == "repo" and (path / "ensemble").is_dir():
            found.append(Artifact(path, manifest))
    if not found:
        raise NotFound(
            f"--repo {folder}: no complete LPX repository there (a folder with ensemble/ and manifest.json, "
            "or artifacts/repos/... from scripts/ci/package.sh)"
        )
    return found


def engine_of(repo: Artifact) -> Artifact:
    """The engine inside a repository, with its build manifest (arch, TensorRT-LLM version)."""
    engine = repo.path / ENGINE_DIR
    try:  # the build's manifest, copied in with the engine (its key names the build folder, not this one)
        manifest = json.loads((engine / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    if not isinstance(manifest, dict):
        manifest = {}
    manifest.setdefault("arch", repo.manifest.get("arch", "any"))
    return Artifact(engine, manifest)


def choose_repository(
    folder: Path, variant: str | None = None, model: str | None = None, arch: str | None = None
) -> Artifact:
    """The repository to serve from `folder`: of `variant` / `model` when given (required when several
    variants are there), built for `arch` when given (a process without a GPU, such as the gateway
    sidecar, is told it), else for this machine's GPU."""
    repos = repositories(folder)
    if model:
        repos = [r for r in repos if r.manifest.get("model") == model] or _none(folder, "model", model, repos)
    if variant:
        repos = [r for r in repos if r.manifest.get("variant") == variant] or _none(
            folder, "variant", variant, repos
        )
    variants = sorted({(r.manifest.get("model"), r.manifest.get("variant")) for r in repos})
    if len(variants) > 1:
        names = ", ".join(f"{m}/{v}" for m, v in variants)
        raise UsageError(
            f"--repo {folder} holds several variants ({names}) - pick one with --variant (and --model)"
        )
    pairs = [(engine_of(r), r) for r in sorted(repos, key=lambda r: -float(r.manifest.get("created", 0)))]
    if arch is not None:
        chosen = [r for e, r in pairs if e.manifest.get("arch") in (arch, "any")]
        if not chosen:
            built = ", ".join(sorted({str(e.manifest.get("arch")) for e, _ in pairs}))
            raise NotFound(f"--repo {folder} has no repository built for {arch} (it has: {built})")
        return chosen[0]
    gpu = None if all(e.manifest.get("arch") == "any" for e, _ in pairs) else detect_gpu()
    return select(pairs, gpu)[1]


def _none(folder: Path, what: str, name: str, repos: list[Artifact]):
    have = ", ".join(sorted({str(r.manifest.get(what)) for r in repos}))
    raise NotFound(f"--repo {folder} has no {what} '{name}' (it has: {have})")
