"""`lpx tune` from start to end: the cells, the quality gate per variant, each cell measured (or read from
its cache) with progress and an estimate of the time left, then the answer written as tune.json, tune.md,
plots and a tuned lpx.yaml per SLO."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..bench import report as bench_report
from ..config import Config
from ..errors import LpxError, UsageError
from ..progress import Reporter
from ..slo import parse_slo
from . import answer, report, space
from .cells import Measurement, measure_local, measure_remote, slo_label
from .search import SearchSettings


@dataclass
class Options:
    slos: list[str]
    out: Path
    endpoints: list[str] = field(default_factory=list)
    only_endpoints: bool = False
    budget_s: float | None = None
    api_key: str | None = None
    variants: list[str] = field(default_factory=list)
    dataset: Path | None = None
    dataset_field: str = "prompt"


def parse_budget(text: str | None) -> float | None:
    """'2h', '90m', '45s' or seconds -> seconds."""
    if not text:
        return None
    m = re.fullmatch(r"\s*([0-9.]+)\s*(h|m|s)?\s*", text)
    if not m:
        raise UsageError(f"Bad --budget {text!r} - write e.g. 2h, 90m or 600s")
    return float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, None: 1}[m.group(2)]


def _duration(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def dataset_prompts(cfg: Config, path: Path, field_name: str, output_len: int) -> tuple[dict, tuple]:
    """A dataset's prompts as the model's token ids (chat-free, special tokens as the tokenizer adds
    them), each cut to what the build leaves for them: max_input_len and max_seq_len - output_len."""
    import hashlib

    import numpy as np

    from ..stages.quantize.model_io import load_tokenizer
    from ..texts import read_texts

    texts, raw = read_texts(path, field_name, "--dataset", "--dataset-field")
    limit = min(cfg.build.max_input_len, cfg.build.max_seq_len - output_len)
    tok = load_tokenizer(cfg)
    ids = tuple(np.asarray(tok(text)["input_ids"][:limit], dtype=np.int32) for text in texts if text.strip())
    ids = tuple(i for i in ids if i.size)
    if not ids:
        raise UsageError(f"--dataset: {path} holds no prompts")
    info = {
        "path": str(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "prompts": len(ids),
        "isl_mean": round(float(np.mean([i.size for i in ids])), 1),
        "cut_to": limit,
    }
    return info, ids


def quality_per_variant(cfg: Config, cells: list[space.Cell], report_: Reporter) -> dict[str, dict]:
    """Quantize and evaluate every variant that has cells left (both cached as always); a variant that
    fails the quality gate or a check loses its cells before anything is built."""
    from ..runner import Runner

    quality: dict[str, dict] = {}
    for name in dict.fromkeys(c.variant for c in cells if not c.pruned and c.url is None):
        v = cfg.variant(name)
        runner = Runner(cfg, report_)
        try:
            outcome = runner.run([v], "eval")[0]
            why = "; ".join(runner.gate_failures) or None
        except LpxError as exc:
            why = exc.message
        if why:
            for c in cells:
                if c.variant == name and c.url is None and not c.pruned:
                    c.pruned = why
            continue
        quality[name] = outcome.artifacts["eval"].manifest.get("results", {})
    return quality


def tune(cfg: Config, opts: Options, report_: Reporter | None = None, echo=print) -> dict[str, Any]:
    report_ = report_ or Reporter()
    t = cfg.tune
    slos = [parse_slo(s, "--slo / tune.slo", required=True) for s in opts.slos]
    if not slos or not all(slos):
        raise UsageError("lpx tune needs an SLO: --slo ttft=200ms,itl=30ms (or tune.slo in lpx.yaml)")
    m = Measurement(
        slos=slos,
        input_len=t.input_len,
        output_len=t.output_len,
        requests=t.requests_per_level,
        warmup=t.warmup,
        search=SearchSettings(
            attainment=t.attainment, max_concurrency=t.max_concurrency, rate_steps=t.rate_steps
        ),
    )
    if opts.dataset is not None:
        m.dataset, m.prompt_ids = dataset_prompts(cfg, opts.dataset, opts.dataset_field, t.output_len)
    cfg.select(
        opts.variants
    )  # an unknown name fails here; the config keeps every variant (space.cell_config)
    cells: list[space.Cell] = []
    gpu = None
    if not opts.only_endpoints:
        from ..runner import Runner
        from ..stages import build

        ctx = Runner(cfg, report_).ctx
        gpus = build.target_gpus(ctx)
        gpu = gpus[0] if gpus else None
        cells = space.cells(cfg, t, gpu, ctx.checkpoint()[0].config, opts.variants)
        prune_elsewhere(cfg, cells)
    cells += space.remote_cells(opts.endpoints)
    if not cells:
        raise UsageError("Nothing to tune: the config has no variants and no --endpoint was given")
    quality = quality_per_variant(cfg, cells, report_)
    live = [c for c in cells if not c.pruned]
    echo(
        f"{len(cells)} cells: {len(live)} to measure, {len(cells) - len(live)} pruned"
        + (f" (fit checked against {gpu.name})" if gpu else " (no GPU named or present: fit not checked)")
    )
    for c in cells:
        if c.pruned:
            echo(f"  pruned {c.name}: {c.pruned}")

    def measure(c: space.Cell, say) -> dict[str, Any]:
        if c.url is None:
            return with_size(measure_local(cfg, c, m, report_, say))
        return measure_remote(c, m, opts.api_key, say)

    docs, not_run = measure_cells(live, measure, opts.budget_s, report_)
    return finish(cfg, opts, m, cells, docs, quality, not_run, echo)


def prune_elsewhere(cfg: Config, cells: list[space.Cell]) -> None:
    """Prune the cells whose variant's build target cannot serve on this machine (llmapi or engine without
    a GPU and TensorRT-LLM, vllm without its environment or with a format its platform has no kernels
    for), with the reason, before anything is built: they stay in the report, not measured."""
    from ..bench.engines import where_not

    why: dict[str, str | None] = {}
    for c in cells:
        if c.pruned or c.url is not None:
            continue
        if c.variant not in why:
            why[c.variant] = where_not(cfg, cfg.variant(c.variant))
        if why[c.variant]:
            c.pruned = f"target {c.target} not run here: {why[c.variant]}"


def with_size(doc: dict[str, Any]) -> dict[str, Any]:
    """A local cell's document with the size on disk of what it served (the build artifact)."""
    from ..artifacts import tree_bytes

    engine = Path((doc.get("artifacts") or {}).get("engine") or "")
    if engine.name and engine.is_dir():
        doc["size_bytes"] = tree_bytes(engine)
    return doc


def measure_cells(
    live: list[space.Cell],
    measure: Callable[[space.Cell, Callable[[str], None]], dict[str, Any]],
    budget_s: float | None,
    report_: Reporter,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each cell measured in turn (a failed one is recorded and skipped), with a progress bar, the time
    left estimated from the cells measured so far (cached ones take no time), and `budget_s` respected:
    a cell is not started when the time spent plus one cell's would pass it."""
    docs: list[dict[str, Any]] = []
    not_run: list[str] = []
    spent: list[float] = []
    started = time.perf_counter()
    with report_.task("tune", len(live)) as advance:
        for i, c in enumerate(live, start=1):
            elapsed = time.perf_counter() - started
            guess = sum(spent) / len(spent) if spent else 0.0
            if budget_s is not None and elapsed + guess > budget_s:
                not_run.append(c.name)
                advance()
                continue
            t0 = time.perf_counter()
            say = lambda msg, c=c: report_.stage("tune", c.name, msg)  # noqa: E731
            try:
                doc = measure(c, say)
            except LpxError as exc:
                c.pruned = f"failed: {exc.message}"
                report_.warn(f"cell {c.name} failed, the tune goes on: {exc.message}")
                advance()
                continue
            advance()
            if not doc["cached"]:
                spent.append(time.perf_counter() - t0)
            docs.append(doc)
            left = len(live) - i
            eta = (sum(spent) / len(spent)) * left if spent else 0.0
            figures = ", ".join(f"{k}: {v['goodput_rps']:.3g} req/s" for k, v in doc["slo"].items())
            report_.stage(
                "tune",
                c.name,
                f"{'[green]cached[/green]' if doc['cached'] else 'measured'} - goodput {figures}"
                + (f"; {left} cell(s) left" if left else "")
                + (f", about {_duration(eta)}" if left and spent else ""),
            )
    return docs, not_run


def finish(cfg, opts, m, cells, docs, quality, not_run, echo) -> dict[str, Any]:
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    parts: dict[str, Any] = {}
    for n, slo in enumerate(m.slos, start=1):
        label = slo_label(slo)
        rows = [answer.row(d, label, quality.get(d["cell"]["variant"])) for d in docs]
        rows.sort(key=lambda r: -r["goodput_rps"])
        chosen = answer.best(rows)
        part: dict[str, Any] = {"rows": rows, "front": answer.pareto(rows), "best": chosen, "config": None}
        if chosen:
            text = answer.tuned_config(cfg, chosen, label, ["written by lpx tune"])
            if text:
                path = out / ("lpx.tuned.yaml" if len(m.slos) == 1 else f"lpx.tuned-{n}.yaml")
                write_atomic(path, text)
                part["config"] = str(path)
        parts[label] = part
    doc = {
        "model": cfg.model.name,
        "measurement": m.key_inputs(),
        "slos": parts,
        "cells": docs,
        "pruned": [{"cell": c.name, "reason": c.pruned} for c in cells if c.pruned],
        "not_run": not_run,
        "notes": [
            "local cells are measured on the tensorrt_llm model over gRPC with token ids"
            + (
                " (output length forced with min_tokens)" if any(d.get("output_forced") for d in docs) else ""
            ),
            "memory: the GPUs' used memory, or on a CPU the resident memory of tritonserver and its models",
        ]
        + (
            ["remote endpoints: OpenAI completions, prompt lengths approximate, output not forced"]
            if opts.endpoints
            else []
        ),
        "environment": bench_report.environment(),
        "finished_at": time.time(),
    }
    doc["plots"] = [str(p) for p in report.plots(doc, out)]
    write_atomic(out / "tune.json", json.dumps(doc, indent=1, default=float))
    md = report.markdown(doc)
    write_atomic(out / "tune.md", md)
    echo(md)
    echo(f"Wrote {out}/tune.md, tune.json, {len(doc['plots'])} plot(s)")
    return doc
