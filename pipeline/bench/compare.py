"""`lpx compare` (its command line is pipeline/cli/tools.py's): bench runs side by side - latency and
throughput per load level, plus the build target (engine) that served each, the quantized model behind
it (its quantize key: equal keys are the same quantized model), quality (the eval artifact) and size on
disk for runs that name a variant. `lpx compare -c` makes the runs itself, one per variant
(engines.py); a variant whose target cannot serve here keeps its line with the reason.

Runs are comparable only on the same GPU and the same load shape (model kind, protocol, input/output
lengths, load levels); anything else is refused, naming the field, unless --force.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..artifacts import Store, tree_bytes
from ..errors import UsageError


# -- reading runs ------------------------------------------------------------------------------------
def load_run(path: Path) -> dict[str, Any]:
    """A bench results.json, from the folder `lpx bench --out` wrote or the file itself."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {file}: {exc} - pass folders written by 'lpx bench --out'") from None
    if not isinstance(doc, dict) or "target" not in doc or "results" not in doc:
        raise UsageError(f"{file} is not an 'lpx bench' results.json (no target/results)")
    doc["_path"] = str(path)
    return doc


def label(doc: dict[str, Any]) -> str:
    v = doc.get("variant") or {}
    return doc.get("label") or v.get("name") or Path(doc["_path"]).name or doc["_path"]


def _levels(doc: dict[str, Any]) -> list[str]:
    out = []
    for r in doc["results"]:
        load = r["load"]
        out.append(
            f"c={load['concurrency']}"
            if load["mode"] == "closed"
            else f"rate={load['rate']:g}/s b={load.get('burstiness', 1.0):g}"
        )
    return out


def shape(doc: dict[str, Any]) -> dict[str, Any]:
    """What must match between compared runs: the GPU and the load shape."""
    t = doc["target"]
    gpus = (doc.get("environment") or {}).get("gpus") or []
    return {
        "GPU": ", ".join(gpus) if gpus else "none",
        "model kind": t.get("model"),
        "protocol": t.get("protocol"),
        "input length": t.get("input_len"),
        "output length": t.get("output_len"),
        "length spread": f"{t.get('input_len_std', 0)}/{t.get('output_len_std', 0)}",
        "dataset prompts": t.get("dataset_prompts", 0),
        "load levels": ", ".join(_levels(doc)),
    }


def mismatches(docs: list[dict[str, Any]]) -> list[str]:
    first = shape(docs[0])
    out = []
    for doc in docs[1:]:
        other = shape(doc)
        for key, value in first.items():
            if other[key] != value:
                out.append(f"{key} differs: {label(docs[0])} has {value}, {label(doc)} has {other[key]}")
    return out


# -- artifacts named by a run ------------------------------------------------------------------------
def parse_variant(ref: str) -> dict[str, str | None]:
    """'VARIANT' or 'MODEL/VARIANT' -> {'model': ..., 'name': ...}."""
    model, _, name = ref.rpartition("/")
    if not name:
        raise UsageError(f"Bad --variant {ref!r} - use VARIANT or MODEL/VARIANT")
    return {"model": model or None, "name": name}


def artifact_facts(doc: dict[str, Any], store: Store | None = None) -> dict[str, Any]:
    """Quality (the eval artifact of the variant: the one its served stages made, else the newest) and
    size on disk (the run's artifact, else the newest engine, else the quantized checkpoint); {} for a
    run that names neither."""
    v = doc.get("variant") or {}
    if not v.get("name") and not v.get("artifact"):
        return {}
    store = store or Store()
    keys = v.get("artifact_keys") or {}
    facts: dict[str, Any] = {}
    if v.get("name"):
        evals = store.newest("eval", v["name"], v.get("model"))
        if keys.get("eval"):
            evals = [a for a in evals if a.key == keys["eval"]] or evals
        if evals:
            facts["quality"] = evals[0].manifest.get("results", {})
            facts["eval"] = str(evals[0].path)
    sized = None
    if v.get("artifact") and Path(v["artifact"]).exists():
        sized = ("artifact", Path(v["artifact"]))
    elif v.get("name"):
        for stage, kind in (("build", "engine"), ("quantize", "checkpoint")):
            found = store.newest(stage, v["name"], v.get("model"))
            if found:
                sized = (kind, found[0].path)
                break
    if sized:
        facts["size_bytes"], facts["size_of"], facts["size_path"] = (
            tree_bytes(sized[1]),
            sized[0],
            str(sized[1]),
        )
    return facts


def target_of(doc: dict[str, Any]) -> str | None:
    """The build target (engine) a run's variant was served on: recorded by `lpx bench -c` / `lpx
    compare -c`, else read from the served config it recorded; None for a server LPX did not build."""
    v = doc.get("variant") or {}
    if v.get("target"):
        return v["target"]
    cfg = v.get("config") or {}
    own = next((x for x in cfg.get("variants") or [] if x.get("name") == v.get("name")), None)
    if own is None:
        return None
    return (own.get("build") or {}).get("target") or (cfg.get("build") or {}).get("target")


# -- output ------------------------------------------------------------------------------------------
def _p(stats: dict[str, float] | None, *keys: str) -> str:
    return "/".join(f"{stats[k]:.1f}" for k in keys) if stats else "-"


def _quality(q: dict[str, Any] | None) -> str:
    if not q:
        return "-"
    if "skipped" in q:
        return "not evaluated"
    return (
        f"KL {q['kl_mean']:.4f}, top-1 {q['top1_agreement']:.1%}, "
        f"ppl {q['ppl_quantized']:.2f} ({q['ppl_increase_pct']:+.1f}%)"
    )


def _size(f: dict[str, Any]) -> str:
    if "size_bytes" not in f:
        return "-"
    b = f["size_bytes"]
    return f"{b / 1e9:.2f} GB ({f['size_of']})" if b >= 1e8 else f"{b / 1e6:.1f} MB ({f['size_of']})"


def run_row(doc: dict[str, Any], f: dict[str, Any]) -> str:
    """A run's line of the first table: what served it, which quantized model, its quality and size."""
    v = doc.get("variant") or {}
    name = "/".join(x for x in (v.get("model"), v.get("name")) if x) or "-"
    quantized = (v.get("artifact_keys") or {}).get("quantize") or "-"
    where = (
        f"not run here: {doc['not_run']}"
        if doc.get("not_run")
        else f"{doc['target']['model']} at {doc['target']['url']}"
    )
    return (
        f"| {label(doc)} | {target_of(doc) or '-'} | {name} | {quantized} | {_quality(f.get('quality'))} "
        f"| {_size(f)} | {where} |"
    )


def markdown(docs: list[dict[str, Any]], facts: list[dict[str, Any]], notes: list[str]) -> str:
    """The runs table (target, quantized model, quality, size, where measured or why not) and the load
    table (TTFT, ITL, tokens/s per level). Runs not measured here have a line in the first only."""
    measured = [d for d in docs if not d.get("not_run")]
    lines = ["# lpx compare", ""]
    if measured:
        s = shape(measured[0])
        lines += [
            f"GPU {s['GPU']}; {s['model kind']} over {s['protocol']}; ISL {s['input length']}, "
            f"OSL {s['output length']}; levels {s['load levels']}",
            "",
        ]
    if notes:
        lines += ["Forced past differences:", *[f"- {n}" for n in notes], ""]
    lines += [
        "| run | target | variant | quantized model | quality vs unquantized | size on disk | measured |",
        "|---|---|---|---|---|---|---|",
        *[run_row(doc, f) for doc, f in zip(docs, facts, strict=True)],
    ]
    if not measured:
        return "\n".join([*lines, "", "No run was measured here: see the reasons above."]) + "\n"
    lines += [
        "",
        "| run | target | load | ok/failed | TTFT p50/p99 ms | ITL p50/p99 ms | out tok/s | tok/s/user p50 | MBU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for doc in measured:
        for level, r in zip(_levels(doc), doc["results"], strict=True):
            mbu = f"{r['roofline']['mbu']:.0%}" if r.get("roofline") else "-"
            lines.append(
                f"| {label(doc)} | {target_of(doc) or '-'} | {level} | {r['succeeded']}/{r['failed']} "
                f"| {_p(r['ttft_ms'], 'p50', 'p99')} | {_p(r['itl_ms'], 'p50', 'p99')} "
                f"| {r['output_tokens_per_s']:.1f} | {_p(r['tokens_per_s_per_user'], 'p50')} | {mbu} |"
            )
    return "\n".join(lines) + "\n"


def plot(docs: list[dict[str, Any]], path: Path) -> Path | None:
    """System output tok/s against tok/s per user (p50), one line per run; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 5))
    for doc in docs:
        pts = [
            (r["tokens_per_s_per_user"]["p50"], r["output_tokens_per_s"], lv)
            for lv, r in zip(_levels(doc), doc["results"], strict=True)
            if r.get("tokens_per_s_per_user")
        ]
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label(doc))
        for x, y, lv in pts:
            ax.annotate(lv, (x, y), fontsize=7)
    ax.set(xlabel="tokens/s per user (p50)", ylabel="output tokens/s (system)", title="lpx compare")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def compare(
    paths: list[Path], force: bool = False, out: Path | None = None, store: Store | None = None
) -> dict[str, Any]:
    """Read the runs, check they are comparable, and return {'markdown', 'facts', 'notes', 'files'}."""
    if not paths:
        raise UsageError("give at least one RUN_DIR (a folder written by 'lpx bench --out')")
    return compare_docs([load_run(p) for p in paths], force, out, store)


def compare_docs(
    docs: list[dict[str, Any]], force: bool = False, out: Path | None = None, store: Store | None = None
) -> dict[str, Any]:
    """`compare` on run documents: bench results, and records of variants not measured here
    (engines.not_run: {'label', 'variant', 'not_run': reason}), which keep their line with the reason."""
    measured = [d for d in docs if not d.get("not_run")]
    notes = mismatches(measured) if measured else []
    if notes and not force:
        raise UsageError(
            "runs are not comparable: " + "; ".join(notes) + " - bench them alike, or pass --force"
        )
    facts = [artifact_facts(d, store) for d in docs]
    md = markdown(docs, facts, notes)
    files: dict[str, str] = {}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(md)
        files["markdown"] = str(out / "compare.md")
        (out / "compare.json").write_text(
            json.dumps({"runs": docs, "facts": facts, "notes": notes}, indent=1, default=str)
        )
        files["json"] = str(out / "compare.json")
        png = plot(measured, out / "compare.png") if measured else None
        if png:
            files["plot"] = str(png)
    return {"markdown": md, "facts": facts, "notes": notes, "files": files, "runs": docs}
