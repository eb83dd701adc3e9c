"""Tables for the terminal."""

from __future__ import annotations

from rich.table import Table

from .config import Config
from .stages.evaluate import gate_failures


def eval_table(outcomes, cfg: Config) -> Table:
    t = Table(title=f"{cfg.model.name}: quality vs the unquantized model (held-out text)")
    for col in ("variant", "format", "KL mean", "top-1 agree", "ppl base", "ppl quant", "ppl +%", "gate"):
        t.add_column(col, justify="left" if col in ("variant", "format", "gate") else "right")
    for o in outcomes:
        art = o.artifacts.get("eval")
        if art is None:
            continue
        r = art.manifest["results"]
        failures = gate_failures(r, cfg.quality_gate)
        if "skipped" in r:
            t.add_row(
                o.variant,
                cfg.variant(o.variant).quantization.format,
                *["n/a"] * 5,
                "[red]FAIL[/red]" if failures else "not evaluated",
            )
            continue
        t.add_row(
            o.variant,
            cfg.variant(o.variant).quantization.format,
            f"{r['kl_mean']:.5f}",
            f"{100 * r['top1_agreement']:.2f}%",
            f"{r['ppl_baseline']:.3f}",
            f"{r['ppl_quantized']:.3f}",
            f"{r['ppl_increase_pct']:+.2f}",
            "[red]FAIL[/red]" if failures else "pass",
        )
    return t
