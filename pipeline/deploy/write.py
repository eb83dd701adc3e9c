"""Write generated objects as a kustomize tree, atomically: everything goes to a staging folder beside
`out`, which replaces `out` only when complete (an interrupted run leaves the old tree or none).

    out/base/                    kustomization.yaml + the objects every arch shares
    out/overlays/<arch>/         kustomization.yaml (resources: ../../base + the workload) + workload.yaml

Every file is a complete object (no patches), so each validates on its own and `kubectl apply -k
out/overlays/sm90` needs nothing else. Dumped with PyYAML from Python data: no text templates.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from ..atomic import replace_folder
from ..errors import LpxError, disk_full, disk_full_cause


def dump(objects: Iterable[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(objects), sort_keys=False, default_flow_style=False)


def file_name(obj: dict[str, Any]) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def kustomization(
    resources: list[str], namespace: str | None = None, images: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """images: kustomize `images:` entries (deploy/images.py), the per-overlay place to change one."""
    k: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace:
        k["namespace"] = namespace
    k["resources"] = resources
    if images:
        k["images"] = images
    return k


def write_tree(out: Path, files: dict[str, list[dict[str, Any]] | dict[str, Any]]) -> list[Path]:
    """files: relative path -> one object or a list (a multi-document file). Returns the written paths."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for rel, content in files.items():
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            docs = content if isinstance(content, list) else [content]
            path.write_text(dump(docs), encoding="utf-8")
        replace_folder(stage, out, out.with_name(f".{out.name}.old-{os.getpid()}"))
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        if disk_full_cause(exc):
            raise disk_full(out.parent, exc) from None
        raise LpxError(f"Cannot write manifests to {out}: {exc} - choose a writable --out folder") from None
    return sorted(p for p in out.rglob("*.yaml"))
