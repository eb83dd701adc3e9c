"""The search space of `lpx tune`: the config's variants x a grid of build limits, and the cells pruned
before any build (a limit the config refuses, a batch whose KV cache cannot fit on the GPU, a variant
that fails the quality gate), each with its reason."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..bench.roofline import kv_dtype_of
from ..config import Config, Variant, format_errors
from ..config.tune import Tune
from ..errors import LpxError, UsageError
from ..facts.gpu import Gpu
from ..inspection.plan import pow2_floor

LIMITS = ("max_batch_size", "max_num_tokens")


@dataclass
class Cell:
    """One point of the search: a variant built with these limits (or a remote endpoint)."""

    variant: str
    limits: dict[str, int] = field(default_factory=dict)
    url: str | None = None  # a remote OpenAI-compatible server: measured as it is, nothing built
    pruned: str | None = None
    target: str | None = None  # the build target (engine) the variant is served on; None for a remote server

    @property
    def name(self) -> str:
        if self.url is not None:
            return self.variant
        return f"{self.variant} b{self.limits['max_batch_size']} t{self.limits['max_num_tokens']}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "variant": self.variant,
            "target": self.target,
            "limits": self.limits,
            "url": self.url,
        }


def cell_config(cfg: Config, variant: Variant, limits: dict[str, int]) -> Config:
    """The config that builds this cell: the build limits replaced, ports picked free (a tune must not
    collide with a running `lpx serve`), the gateway off (cells are measured on Triton's gRPC). Every
    variant stays: those that differ from `variant` only by target share its quantize artifact (the same
    key as `lpx run` on the config gives it), so a cell quantizes nothing the config did not."""
    data = cfg.model_dump(mode="python")
    if "trtllm_version" not in cfg.build.model_fields_set:  # the default line of build.target, not a pin:
        data["build"].pop("trtllm_version")  # kept, it would refuse a variant's own engine target (1.3)
    data["build"].update(limits)
    data["serving"].update(http_port=0, grpc_port=0, metrics_port=0)
    data["serving"]["openai"]["enabled"] = False
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise UsageError("; ".join(format_errors(exc))) from None


def grid_values(
    cfg: Config, tune: Tune, variant: Variant, fit: dict[str, Any] | None
) -> dict[str, list[int]]:
    """The limits tried for a variant: the config's grid, else around `lpx plan`'s suggestion for the GPU
    (half and all of it), else half and all of the build section's values."""
    b = cfg.build
    out: dict[str, list[int]] = {}
    for name in LIMITS:
        given = getattr(tune.grid, name)
        if given:
            out[name] = sorted(given)
            continue
        suggested = (fit or {}).get(f"suggested_{name}")
        top = int(suggested) if suggested else getattr(b, name)
        low = max(1, top // 2) if name == "max_batch_size" else max(tune.input_len, pow2_floor(top // 2))
        out[name] = sorted({low, top})
    return out


def plan_rows(cfg: Config, tune: Tune, gpu: Gpu | None, model_config: dict) -> dict[str, dict[str, Any]]:
    """variant -> its format's row of `lpx plan` at input_len + output_len tokens per sequence (empty
    without a GPU: nothing can be said about fit on a CPU). `model_config`: the checkpoint's config.json."""
    if gpu is None:
        return {}
    from ..inspection.plan import plan, shape_from_config

    shape = shape_from_config(model_config, str(cfg.model.checkpoint))
    rows = {}
    for v in cfg.variants:
        q = v.quantization
        kv = kv_dtype_of(q.kv_cache)
        doc = plan(
            shape, gpu, tune.input_len + tune.output_len, max_seq_len=cfg.build.max_seq_len, kv_dtype=kv
        )
        row = next(r for r in doc["formats"] if r["format"] == q.format)
        rows[v.name] = {**row, "kv_dtype": kv, "gpu": gpu.name, "gpus": cfg.build.tp_size * cfg.build.pp_size}
    return rows


def fit_reason(limits: dict[str, int], row: dict[str, Any] | None, tune: Tune) -> str | None:
    """Why a cell cannot use its batch on the GPU, or None (also when there is no GPU to check)."""
    if not row:
        return None
    if row.get("runs_on_gpu") is False:
        return f"{row['format']} does not run on {row['gpu']} (lpx plan)"
    if row.get("kv_pool_bytes") is None:
        return f"{row['format']} weights leave no room for a KV cache on {row['gpu']} (lpx plan)"
    fit = int(row["fit_sequences"]) * max(1, int(row.get("gpus") or 1))
    if limits["max_batch_size"] > fit:
        return (
            f"max_batch_size {limits['max_batch_size']} > the {fit} sequences of "
            f"{tune.input_len + tune.output_len} tokens whose {row['kv_dtype']} KV cache fits beside the "
            f"{row['format']} weights on {row['gpu']} (lpx plan): slots that can never fill"
        )
    return None


def cells(
    cfg: Config, tune: Tune, gpu: Gpu | None, model_config: dict, names: list[str] | None = None
) -> list[Cell]:
    """Every cell of the grid (of the variants `names`, default all), pruned where the config or the GPU's
    memory refuses it. `model_config`: the checkpoint's config.json (its shape sizes the KV cache)."""
    need = tune.input_len + tune.output_len
    if cfg.build.max_seq_len < need:
        raise UsageError(
            f"build.max_seq_len {cfg.build.max_seq_len} < input_len + output_len = {need} - raise "
            "build.max_seq_len or ask for shorter requests (--isl/--osl)"
        )
    if cfg.build.max_input_len < tune.input_len:
        raise UsageError(
            f"build.max_input_len {cfg.build.max_input_len} < input_len {tune.input_len} - raise "
            "build.max_input_len or lower --isl"
        )
    rows = plan_rows(cfg, tune, gpu, model_config)
    out = []
    for v in cfg.select(names or None):
        grid = grid_values(cfg, tune, v, rows.get(v.name))
        for values in itertools.product(*(grid[k] for k in LIMITS)):
            limits = dict(zip(LIMITS, values, strict=True))
            cell = Cell(v.name, limits, target=cfg.target_of(v))
            try:
                cell_config(cfg, v, limits)
            except LpxError as exc:
                cell.pruned = f"the config refuses these limits: {exc}"
            else:
                cell.pruned = fit_reason(limits, rows.get(v.name), tune)
            out.append(cell)
    return out


def remote_cells(endpoints: list[str]) -> list[Cell]:
    """NAME=URL pairs (servers the user started: vLLM, trtllm-serve, Dynamo) as cells measured as they are."""
    out = []
    for item in endpoints:
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.startswith(("http://", "https://")):
            raise UsageError(
                f"Bad --endpoint {item!r} - write NAME=http://HOST:PORT (an OpenAI-compatible server)"
            )
        out.append(Cell(name.strip(), url=url.rstrip("/")))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise UsageError("--endpoint names must be unique")
    return out
