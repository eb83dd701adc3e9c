"""Write a bench: results.json (results + environment + load), results.md (a table) and PNG plots
when matplotlib is installed."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from .. import toolchain
from ..atomic import write_atomic
from . import roofline


def gpu_names() -> list[str]:
    """Names of the GPUs present (NVML, else nvidia-smi), [] without a driver."""
    from ..facts.gpu import gpu_state

    state = gpu_state(full=False)
    return [g.name for g in state.gpus] if state else []


def environment() -> dict[str, Any]:
    return {
        "gpus": gpu_names(),
        "versions": toolchain.versions(),
        **toolchain.environment(),
        "host": platform.node(),
    }


def _v(stats: dict[str, float] | None, key: str) -> str:
    return f"{stats[key]:.1f}" if stats else "-"


def _level(load: dict[str, Any]) -> str:
    if load["mode"] == "closed":
        return f"c={load['concurrency']}"
    return f"rate={load['rate']:g}/s (b={load['burstiness']:g})"


def _span(stats: dict[str, float] | None) -> str:
    if not stats:
        return "-"
    return f"{stats['mean']:.1f} ({stats['min']:.0f}-{stats['max']:.0f})"


def lengths(doc: dict[str, Any]) -> list[str]:
    """Requested vs measured ISL/OSL per level (mean (min-max)), and how they were got."""
    t = doc["target"]
    rows = [r for r in doc["results"] if "isl_requested" in r]
    if not rows:
        return []
    prompts = t.get("prompts") or {}
    how = [f"prompts: {prompts.get('kind', '-')}"]
    if prompts.get("tokenizer"):
        how.append(f"tokenizer {prompts['tokenizer']}")
    counted = sorted({c for r in rows for c in r.get("isl_counted_by") or []})
    how.append(
        f"ISL measured by {', '.join(counted) if counted else 'nothing (no tokenizer, no server count)'}"
    )
    how.append(f"OSL {'forced (min_tokens = max_tokens)' if t.get('output_forced') else 'not forced'}")
    lines = [
        "",
        "Lengths, requested vs measured - mean (min-max) over successful requests; " + "; ".join(how),
        "",
        "| load | ISL requested | ISL measured | OSL requested | OSL measured |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {_level(r['load'])} | {_span(r['isl_requested'])} | {_span(r['isl'])} "
            f"| {_span(r['osl_requested'])} | {_span(r['osl'])} |"
        )
    if doc.get("notes"):
        lines += ["", "Notes:", *[f"- {n}" for n in doc["notes"]]]
    return lines


def markdown(doc: dict[str, Any]) -> str:
    t = doc["target"]
    v = doc.get("variant") or {}
    named = "/".join(x for x in (v.get("model"), v.get("name")) if x)
    lines = [
        f"# lpx bench: {t['model']} at {t['url']} ({t['protocol']})"
        + (f" - {doc['label']}" if doc.get("label") else "")
        + (f", variant {named}" if named else ""),
        "",
        f"ISL {t['input_len']}, OSL {t['output_len']} requested; output tokens counted from "
        f"{doc['results'][0]['token_source'] if doc['results'] else '-'}"
        + (
            " (text only: one response counted as one token)"
            if doc["results"] and doc["results"][0]["token_source"] == "responses"
            else ""
        ),
        "",
        "| load | ok | failed | TTFT p50/p99 ms | ITL p50/p99 ms | E2E p50/p99 ms | out tok/s | req/s "
        "| tok/s/user p50 | goodput req/s | client CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        good = f"{r['goodput_rps']:.2f}" if r["goodput_rps"] is not None else "-"
        lines.append(
            f"| {_level(r['load'])} | {r['succeeded']} | {r['failed']} | {_v(r['ttft_ms'], 'p50')}/{_v(r['ttft_ms'], 'p99')} "
            f"| {_v(r['itl_ms'], 'p50')}/{_v(r['itl_ms'], 'p99')} | {_v(r['e2e_ms'], 'p50')}/{_v(r['e2e_ms'], 'p99')} "
            f"| {r['output_tokens_per_s']:.1f} | {r['requests_per_s']:.2f} | {_v(r['tokens_per_s_per_user'], 'p50')} "
            f"| {good} | {r['client_cpu_util']:.0%} |"
        )
    lines += lengths(doc)
    lines += roofline.markdown(doc)
    errors = sorted({e for r in doc["results"] for e in r["errors"]})
    if errors:
        lines += ["", "Errors seen:", *[f"- {e}" for e in errors]]
    return "\n".join(lines) + "\n"


def plots(doc: dict[str, Any], out: Path) -> list[Path]:
    """throughput.png, latency.png, pareto.png; [] (and a note in the doc) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        doc["plots_note"] = "plots skipped: matplotlib is not installed"
        return []
    rows = [r for r in doc["results"] if r["ttft_ms"]]
    if not rows:
        return []
    closed = all(r["load"]["mode"] == "closed" for r in rows)
    xs = [r["load"]["concurrency"] if closed else r["load"]["rate"] for r in rows]
    xlabel = "concurrency" if closed else "request rate (req/s)"
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["output_tokens_per_s"] for r in rows], "o-")
    ax.set(xlabel=xlabel, ylabel="output tokens/s (system)", title="Throughput")
    paths.append(save_figure(fig, out / "throughput.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        for p in ("p50", "p90", "p99"):
            ax.plot(xs, [r[key][p] if r[key] else float("nan") for r in rows], "o-", label=p)
        ax.set(xlabel=xlabel, ylabel=f"{name} (ms)", title=name)
        ax.legend()
    paths.append(save_figure(fig, out / "latency.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    per_user = [
        r["tokens_per_s_per_user"]["p50"] if r["tokens_per_s_per_user"] else float("nan") for r in rows
    ]
    ax.plot(per_user, [r["output_tokens_per_s"] for r in rows], "o-")
    for x, y, label in zip(per_user, [r["output_tokens_per_s"] for r in rows], xs, strict=True):
        ax.annotate(str(label), (x, y))
    ax.set(xlabel="tokens/s per user (p50)", ylabel="output tokens/s (system)", title="Pareto")
    paths.append(save_figure(fig, out / "pareto.png"))
    return paths


def save_figure(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write(doc: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json, results.md and any plots in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = {f"plot:{p.stem}": p for p in plots(doc, out)}
    write_atomic(out / "results.json", json.dumps(doc, indent=2, default=str) + "\n")
    write_atomic(
        out / "results.md", markdown(doc) + (f"\n{doc['plots_note']}\n" if "plots_note" in doc else "")
    )
    return {"json": out / "results.json", "markdown": out / "results.md", **written}
