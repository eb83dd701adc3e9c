"""`lpx tune`'s report: tune.md, tune.json's companion plots (goodput against load per cell, the Pareto
front) and the tuned lpx.yaml files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bench.report import save_figure


def _f(v: Any, fmt: str = "{:.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(doc: dict[str, Any]) -> str:
    m = doc["measurement"]
    inputs = (
        f"prompts of {m['dataset']['path']} ({m['dataset']['prompts']}, {m['dataset']['isl_mean']:g} tokens on average)"
        if m.get("dataset")
        else f"{m['input_len']} input tokens"
    )
    lines = [
        f"# lpx tune: {doc['model']}",
        "",
        f"{inputs} / {m['output_len']} output tokens per request, {m['requests']} requests per "
        f"level, a level passes when {m['search']['attainment']:.0%} of its requests meet the SLO. "
        f"Goodput: requests/s meeting the SLO at the highest Poisson rate that passed. Machine: "
        f"{', '.join(doc['environment'].get('gpus') or []) or 'no GPU'} ({doc['environment'].get('host')}).",
        "",
    ]
    for slo, part in doc["slos"].items():
        lines += [
            f"## SLO {slo}",
            "",
            "| cell | target | goodput req/s | knee concurrency | Poisson rate /s | tok/s per GPU | tok/s per user p50 | memory GiB | size on disk MB | KL | top-1 | front | |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in part["rows"]:
            mark = "best" if part["best"] and r["cell"] == part["best"]["cell"] else ""
            note = r["reason"] or ("cached" if r["cached"] else "")
            lines.append(
                f"| {r['cell']} | {r.get('target') or '-'} | {_f(r['goodput_rps'])} | {_f(r['knee_concurrency'], '{}')} | {_f(r['rate_rps'])} "
                f"| {_f(r['tokens_per_s_per_gpu'], '{:.1f}')} | {_f(r['tokens_per_s_per_user'], '{:.1f}')} "
                f"| {_f(r['memory_gib'], '{:.2f}')} ({r['memory_kind']}) "
                f"| {_f(r.get('size_bytes') and r['size_bytes'] / 1e6, '{:.1f}')} | {_f(r['kl_mean'], '{:.4f}')} "
                f"| {_f(r['top1_agreement'], '{:.3f}')} | {'yes' if r['cell'] in part['front'] else ''} "
                f"| {' '.join(x for x in (mark, note) if x)} |"
            )
        if part["best"]:
            b = part["best"]
            lines += [
                "",
                f"Best: **{b['cell']}** - {b['goodput_rps']:.3g} req/s at the SLO"
                + (f"; config: `{part['config']}`" if part.get("config") else ""),
            ]
        else:
            lines += ["", "No cell met this SLO at any load: relax the SLO or add variants / limits."]
        lines.append("")
    if doc["pruned"]:
        lines += ["## Pruned before any build", ""]
        lines += [f"- {p['cell']}: {p['reason']}" for p in doc["pruned"]]
        lines.append("")
    if doc.get("not_run"):
        lines += ["## Not run (budget spent)", ""] + [f"- {name}" for name in doc["not_run"]] + [""]
    if doc.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    return "\n".join(lines)


def plots(doc: dict[str, Any], out: Path) -> list[Path]:
    """goodput-<n>.png (goodput against concurrency and Poisson rate, one line per cell) and
    front-<n>.png (goodput against memory, the front marked) per SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for i, (slo, part) in enumerate(doc["slos"].items(), start=1):
        fig, (ax_c, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
        for cell in doc["cells"]:
            levels = cell["slo"][slo]["levels"]
            for ax, kind in ((ax_c, "closed"), (ax_r, "poisson")):
                pts = sorted((lv["load"], lv["goodput_rps"] or 0.0) for lv in levels if lv["kind"] == kind)
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=cell["cell"]["name"])
        ax_c.set(
            xlabel="concurrency (closed loop)", ylabel="goodput (req/s)", xscale="log", title=f"SLO {slo}"
        )
        ax_r.set(xlabel="Poisson rate (req/s)", ylabel="goodput (req/s)")
        ax_c.legend(fontsize=7)
        written.append(save_figure(fig, out / f"goodput-{i}.png"))
        rows = [r for r in part["rows"] if r["memory_gib"] is not None]
        if rows:
            fig, ax = plt.subplots(figsize=(6, 4))
            for r in rows:
                on = r["cell"] in part["front"]
                ax.scatter(r["memory_gib"], r["goodput_rps"], marker="*" if on else "o", s=120 if on else 40)
                ax.annotate(r["cell"], (r["memory_gib"], r["goodput_rps"]), fontsize=7)
            ax.set(
                xlabel="memory in use (GiB)", ylabel="goodput at the SLO (req/s)", title=f"front, SLO {slo}"
            )
            written.append(save_figure(fig, out / f"front-{i}.png"))
    return written
