"""Decode roofline for a bench: the bandwidth ceiling of a decode step and the achieved model-bandwidth
utilization (MBU) from the measured ITL.

A decode step at batch B reads every weight once plus each sequence's KV cache, so
  bytes/step = weight bytes + B x KV bytes per token x mean context (ISL + OSL/2)
  ceiling ITL = bytes/step / bandwidth        MBU = bytes/step / measured ITL / bandwidth
B is the concurrency (closed loop) or the mean number of decoding requests, output tok/s x ITL
(open loop). Weight bytes come from pipeline.inspection.plan's shape arithmetic, not from the files on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import LpxError, UsageError
from ..facts.gpu import Gpu, find_gpu, lookup_gpu
from ..inspection.plan import KV_BYTES, kv_bytes_per_token, shape_from_config, weight_bytes


def shape_of(checkpoint: Path):
    """The ModelShape of an HF checkpoint folder, or of the first HF config.json below it (an export)."""
    checkpoint = Path(checkpoint)
    candidates = [checkpoint / "config.json", *sorted(checkpoint.rglob("config.json"))]
    for path in candidates:
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        cfg = cfg.get("text_config", cfg)
        if "num_hidden_layers" in cfg:
            return shape_from_config(cfg, checkpoint.name)
    raise UsageError(
        f"no HF config.json with num_hidden_layers under {checkpoint} - pass --checkpoint "
        "pointing at the model's HF folder"
    )


def roofline_gpu(names: list[str], given: str | None) -> Gpu | None:
    """--gpu NAME if given (unknown: an error), else the first of the GPUs the bench recorded that the
    table knows."""
    if given:
        return lookup_gpu(given)
    return next((g for g in (find_gpu(n) for n in names) if g is not None), None)


def kv_dtype_of(kv_cache: str | None) -> str:
    return kv_cache if kv_cache in KV_BYTES else "bf16"


def roofline(
    doc: dict[str, Any], gpu: Gpu, checkpoint: Path, fmt: str, kv_dtype: str = "bf16"
) -> dict[str, Any]:
    """doc['roofline'] (what was assumed) and a 'roofline' entry in each result with ITL; returns the former."""
    shape = shape_of(checkpoint)
    weights = weight_bytes(shape, fmt)["weight_bytes"]
    kv_tok = kv_bytes_per_token(shape, kv_dtype)
    t = doc["target"]
    context = t["input_len"] + t["output_len"] / 2
    info = {
        "gpu": gpu.key,
        "bandwidth_bytes_per_s": gpu.bandwidth_bytes_per_s,
        "checkpoint": str(checkpoint),
        "format": fmt,
        "kv_dtype": kv_dtype,
        "weight_bytes": weights,
        "kv_bytes_per_token": kv_tok,
        "mean_context": context,
    }
    for r in doc["results"]:
        itl = r.get("itl_ms")
        if not itl:
            continue
        if r["load"]["mode"] == "closed":
            batch = float(r["load"]["concurrency"])
        else:
            batch = max(1.0, r["output_tokens_per_s"] * itl["mean"] / 1e3)
        step = weights + batch * kv_tok * context
        ceiling_s = step / gpu.bandwidth_bytes_per_s
        r["roofline"] = {
            "batch": batch,
            "bytes_per_step": step,
            "ceiling_itl_ms": ceiling_s * 1e3,
            "ceiling_tokens_per_s": batch / ceiling_s,
            "mbu": ceiling_s * 1e3 / itl["mean"],
        }
    doc["roofline"] = info
    return info


def roofline_inputs(
    doc: dict[str, Any],
    gpu: str | None = None,
    checkpoint: Path | None = None,
    format: str | None = None,
    kv_dtype: str | None = None,
) -> tuple | str:
    """(Gpu, checkpoint, format, kv dtype) for the roofline, from the options or the variant's quantize
    manifest; a note saying what is missing otherwise."""
    g = roofline_gpu(doc["environment"].get("gpus") or [], gpu)
    variant = doc.get("variant") or {}
    if (checkpoint is None or format is None) and variant.get("name"):
        from ..artifacts import Store

        found = Store().newest("quantize", variant["name"], variant.get("model"))
        if found:
            res = found[0].manifest.get("results", {})
            checkpoint = checkpoint or found[0].path
            format = format or res.get("format")
            kv_dtype = kv_dtype or kv_dtype_of(res.get("kv_cache"))
    missing = [
        what
        for what, v in (
            ("--gpu (no known GPU detected)", g),
            ("--checkpoint", checkpoint),
            ("--format", format),
        )
        if v is None
    ]
    if missing:
        return "roofline skipped: give " + ", ".join(missing) + " (or --variant with a quantize artifact)"
    return g, Path(checkpoint), format, kv_dtype or "bf16"  # type: ignore[arg-type]


def attach(doc: dict[str, Any], roof: dict[str, Any]) -> None:
    """The roofline into `doc` (roofline_inputs' keyword arguments in `roof`), or doc['roofline_note']
    saying why it was skipped."""
    try:
        args = roofline_inputs(doc, **roof)
        if isinstance(args, str):
            doc["roofline_note"] = args
        else:
            roofline(doc, *args)
    except LpxError as exc:
        doc["roofline_note"] = f"roofline skipped: {exc}"


def markdown(doc: dict[str, Any]) -> list[str]:
    info = doc.get("roofline")
    if not info:
        return []
    lines = [
        "",
        f"Decode roofline on {info['gpu']} ({info['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s): weights "
        f"{info['weight_bytes'] / 1e9:.2f} GB ({info['format']}), KV {info['kv_bytes_per_token']:,} B/token "
        f"({info['kv_dtype']}), mean context {info['mean_context']:g} tokens",
        "",
        "| load | batch | GB/step | ceiling ITL ms | ceiling tok/s | measured ITL ms | MBU |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        rf = r.get("roofline")
        if rf:
            level = (
                f"c={r['load']['concurrency']}"
                if r["load"]["mode"] == "closed"
                else f"rate={r['load']['rate']:g}/s"
            )
            lines.append(
                f"| {level} | {rf['batch']:g} | {rf['bytes_per_step'] / 1e9:.2f} | {rf['ceiling_itl_ms']:.2f} "
                f"| {rf['ceiling_tokens_per_s']:,.0f} | {r['itl_ms']['mean']:.2f} | {rf['mbu']:.1%} |"
            )
    return lines
