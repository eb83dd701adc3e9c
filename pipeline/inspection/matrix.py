"""`lpx matrix`: the CI build matrix, one cell per variant x GPU architecture.

A cell is what one CI job builds: {name, variant, format, kv_cache, arch, sm, tp_size, pp_size,
gpus (= tp_size x pp_size), target, trtllm_version, runner_label}. The config has one tp_size /
pp_size, so every cell carries that split. `runner_label` (e.g. "gpu-sm90") is a label, not a
machine: CI maps it to runners by registering self-hosted runners with that label (see
examples/ci/build-engines.yml). The `torch` target has no per-arch build: one cell per variant
with arch "any" and runner_label "cpu".

Cells a GPU cannot run (format or KV-cache type newer than the arch, or a format unknown to the
targeted TensorRT-LLM line) are left out and listed under "excluded" with the reason.

Formats: json = {"include": [...], "excluded": [...]} pretty-printed; github = one line,
{"include": [...]}, scalar values only, for `strategy.matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}`.
"""

from __future__ import annotations

from pathlib import Path

from ..config import Config, load_config
from ..errors import UsageError
from ..facts.formats import refusal, sm_number, unknown_algo


def _reason(fmt: str, kv: str, arch: str, version: str) -> str | None:
    """Why this format / KV-cache type cannot be built for this arch, or None."""
    return refusal(fmt, kv, sm=sm_number(arch)) or unknown_algo(fmt, kv, version)


def _cells(cfg: Config) -> list[tuple[dict, str | None]]:
    """Every variant x arch cell, in config order, with why it cannot be built (or None)."""
    b = cfg.build
    out = []
    for v in cfg.variants:
        q = v.quantization
        for arch in ["any"] if b.target == "torch" else b.archs:
            cell = {
                "name": f"{v.name}-{arch}",
                "variant": v.name,
                "format": q.format,
                "kv_cache": q.kv_cache,
                "arch": arch,
                "sm": 0 if arch == "any" else sm_number(arch),
                "tp_size": b.tp_size,
                "pp_size": b.pp_size,
                "gpus": b.tp_size * b.pp_size,
                "target": b.target,
                "trtllm_version": b.trtllm_version,
                "runner_label": "cpu" if arch == "any" else f"gpu-{arch}",
            }
            out.append(
                (cell, None if arch == "any" else _reason(q.format, q.kv_cache, arch, b.trtllm_version))
            )
    return out


def build_matrix(cfg: Config) -> list[dict]:
    """The cells to build: variants x archs, in config order, leaving out those the arch cannot run."""
    return [cell for cell, reason in _cells(cfg) if reason is None]


def excluded_cells(cfg: Config) -> list[dict]:
    """The cells left out: {name, variant, format, kv_cache, arch, reason}."""
    keep = ("name", "variant", "format", "kv_cache", "arch")
    return [{k: cell[k] for k in keep} | {"reason": reason} for cell, reason in _cells(cfg) if reason]


def config_path(path: Path | None) -> Path:
    if path is not None:
        return path
    if Path("lpx.yaml").is_file():
        return Path("lpx.yaml")
    raise UsageError("no config: pass -c lpx.yaml, or run in a folder that has an lpx.yaml")


def matrix(cfg: Config) -> dict:
    """What `lpx matrix` prints: {"include": cells, "excluded": cells left out}; a UsageError when empty."""
    include, excluded = build_matrix(cfg), excluded_cells(cfg)
    if not include:
        raise UsageError(
            "the matrix is empty: no variant can run on any of build.archs - "
            "add a newer arch to build.archs or choose another format"
        )
    return {"include": include, "excluded": excluded}


def write_cell_config(config_path: Path, variant: str, arch: str | None, out: Path) -> Path:
    """Write `config_path` narrowed to one CI cell: build.archs = [arch], or (arch None) every arch the
    variant can run. Paths are made absolute, so `out` may live anywhere. Keys are unchanged: the
    quantize and build keys do not include build.archs, so artifacts built from it are the config's own."""
    from ..config import dump_config

    cfg = load_config(config_path)
    cfg.variant(variant)
    cells = [c for c in build_matrix(cfg) if c["variant"] == variant]
    archs = [c["arch"] for c in cells if arch is None or c["arch"] == arch]
    if not archs:
        why = [e["reason"] for e in excluded_cells(cfg) if e["variant"] == variant and e["arch"] == arch]
        raise UsageError(
            f"variant '{variant}' has no cell for {arch or 'any arch'}"
            f"{': ' + why[0] if why else ''} - see 'lpx matrix -c {config_path}'"
        )
    if cfg.build.target != "torch":
        cfg.build.archs = archs
    out.write_text(dump_config(cfg), encoding="utf-8")
    return out
