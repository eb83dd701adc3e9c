"""The answer of `lpx tune`: per SLO, each measured cell's figures, the Pareto front over (quality, goodput
at the SLO, memory), the best cell and a ready lpx.yaml for it."""

from __future__ import annotations

from typing import Any

from ..config import Config, dump_config

# Quality is the variant's mean KL divergence from the unquantized model (lower is better; the
# unquantized variant scores 0). Goodput is requests/s meeting the SLO (higher is better), memory GiB in
# use while serving (lower is better).


def row(cell_doc: dict[str, Any], slo: str, quality: dict[str, Any] | None) -> dict[str, Any]:
    """One cell's figures under one SLO."""
    res = cell_doc["slo"][slo]
    best = res.get("best_rate") or res.get("knee") or {}
    gpus = cell_doc.get("gpus") or 1
    tps = best.get("output_tokens_per_s")
    per_user = (best.get("tokens_per_s_per_user") or {}).get("p50")
    return {
        "cell": cell_doc["cell"]["name"],
        "variant": cell_doc["cell"]["variant"],
        "target": cell_doc["cell"].get("target"),
        "size_bytes": cell_doc.get("size_bytes"),
        "limits": cell_doc["cell"]["limits"],
        "url": cell_doc["cell"].get("url"),
        "goodput_rps": res["goodput_rps"],
        "knee_concurrency": res["knee_concurrency"],
        "rate_rps": (res.get("best_rate") or {}).get("load"),
        "tokens_per_s_per_gpu": tps / gpus if tps is not None else None,
        "tokens_per_s_per_user": per_user,
        "memory_gib": (cell_doc.get("memory") or {}).get("gib"),
        "memory_kind": (cell_doc.get("memory") or {}).get("kind"),
        "kl_mean": (quality or {}).get("kl_mean"),
        "top1_agreement": (quality or {}).get("top1_agreement"),
        "reason": res.get("reason"),
        "cached": cell_doc.get("cached", False),
    }


def _dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """a is at least as good as b in every objective and better in one."""
    ge = (
        a["goodput_rps"] >= b["goodput_rps"]
        and a["kl_mean"] <= b["kl_mean"]
        and a["memory_gib"] <= b["memory_gib"]
    )
    gt = (
        a["goodput_rps"] > b["goodput_rps"]
        or a["kl_mean"] < b["kl_mean"]
        or a["memory_gib"] < b["memory_gib"]
    )
    return ge and gt


def pareto(rows: list[dict[str, Any]]) -> list[str]:
    """Names of the cells no other cell dominates, among those that met the SLO at some load and whose
    three objectives are known (remote endpoints have no quality or memory figure: they are compared
    on goodput only, in the table)."""
    known = [
        r for r in rows if r["goodput_rps"] > 0 and r["kl_mean"] is not None and r["memory_gib"] is not None
    ]
    return [r["cell"] for r in known if not any(_dominates(o, r) for o in known if o is not r)]


def best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The most goodput at the SLO; ties go to less memory, then better quality, then the smaller batch."""
    passing = [r for r in rows if r["goodput_rps"] > 0]
    if not passing:
        return None

    def rank(r: dict[str, Any]) -> tuple:
        return (
            -r["goodput_rps"],
            r["memory_gib"] if r["memory_gib"] is not None else float("inf"),
            r["kl_mean"] if r["kl_mean"] is not None else float("inf"),
            (r["limits"] or {}).get("max_batch_size", 0),
        )

    return min(passing, key=rank)


def tuned_config(cfg: Config, chosen: dict[str, Any], slo: str, header: list[str]) -> str | None:
    """The config that builds the chosen cell: its variant only, its limits; None for a remote endpoint."""
    if chosen.get("url"):
        return None
    tuned = cfg.model_copy(deep=True)
    tuned.variants = [tuned.variant(chosen["variant"])]
    for name, value in chosen["limits"].items():
        setattr(tuned.build, name, value)  # validated on assignment, as every cell was
    lines = [f"# {line}" for line in header] + [
        f"# chosen by lpx tune for SLO {slo}: {chosen['cell']}, goodput {chosen['goodput_rps']:.3g} req/s"
    ]
    return "\n".join(lines) + "\n" + dump_config(tuned)
