"""`lpx bench`: sweep concurrency levels (closed loop) or one request rate (open loop) against a URL, or
against a variant LPX builds and serves for the purpose (served.py); the command line is
pipeline/cli/tools.py's, which hands its options over as one BenchOptions (options.py). The requests are
settled by target.py, the roofline by roofline.py, the files by report.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import StageFailed
from ..facts.gpu import lookup_gpu
from . import report, roofline
from .compare import parse_variant
from .load import LoadSpec, Run, run_closed, run_open
from .metrics import summarize
from .options import BenchOptions
from .served import as_served, openai_target, served_variant
from .target import declare, output_notes, requests_of

Echo = Callable[[str], Any]


def measure(opts: BenchOptions, echo: Echo = print) -> dict[str, Any]:
    """What `lpx bench` does: measure the model at opts.url (or, without one, the variant LPX builds and
    serves from opts.config_path) and print the report through `echo`; returns the report document."""
    opts.check()
    opts = openai_target(opts)
    if opts.url is None:
        with served_variant(opts.config_path, opts.variant_ref, opts.protocol) as (url, served):
            return measure(as_served(opts, url, served), echo)
    spec, notes, source = requests_of(opts)
    if opts.gpu:
        lookup_gpu(opts.gpu)  # an unknown name fails before the load runs
    doc = bench(spec, opts, notes, source, echo)
    show(doc, opts, echo)
    if all(r["succeeded"] == 0 for r in doc["results"]):
        raise StageFailed(
            f"Every request failed against {spec.url} - first errors: {doc['results'][0]['errors'][:2]}"
        )
    return doc


def variant_record(opts: BenchOptions) -> dict[str, Any] | None:
    """What `lpx compare` reads about the variant measured: --variant, --artifact, and the provenance of a
    variant LPX served (the config and the key of every artifact behind the served repository)."""
    variant: dict[str, Any] | None = parse_variant(opts.variant_ref) if opts.variant_ref else None
    if opts.artifact is not None:
        variant = {**(variant or {"model": None, "name": None}), "artifact": str(opts.artifact.resolve())}
    if opts.provenance:
        variant = {**(variant or {}), **opts.provenance}
    return variant


def bench(
    spec: LoadSpec, opts: BenchOptions, notes: list[str], source: dict[str, Any], echo: Echo | None = None
) -> dict[str, Any]:
    """Run the load against `spec.url` and return the report document; write it to opts.out if given.
    `notes` and `source` (where the prompts come from) go into the report as they are."""
    declare(spec)
    notes = [*notes, *output_notes(spec)]
    if echo:
        for note in notes:
            echo(f"note: {note}")
    doc = {
        "target": target_record(spec, source),
        "notes": notes,
        "results": levels(spec, opts, echo),
        "environment": report.environment(),
        "finished_at": time.time(),
    }
    if opts.label:
        doc["label"] = opts.label
    variant = variant_record(opts)
    if variant:
        doc["variant"] = variant
    roof = {"gpu": opts.gpu, "checkpoint": opts.checkpoint, "format": opts.fmt, "kv_dtype": opts.kv_dtype}
    roofline.attach(doc, roof)
    if opts.out is not None:
        doc["files"] = {k: str(v) for k, v in report.write(doc, opts.out).items()}
    return doc


def levels(spec: LoadSpec, opts: BenchOptions, echo: Echo | None) -> list[dict[str, Any]]:
    """Every level's summary: the one open-loop rate, or each closed-loop concurrency in turn."""
    from ..progress import Reporter

    bar = Reporter()
    slo = opts.slo_ms

    def progressed(label: str, total: int | None, run: Callable[[], Run]) -> dict[str, Any]:
        with bar.task(label, total) as advance:
            spec.on_done = lambda _rec: advance()
            try:
                return summarize(run(), slo)
            finally:
                spec.on_done = None

    rate, warmup, duration = opts.rate, opts.warmup, opts.duration
    if rate is not None:
        n = opts.requests or max(1, int(rate * (duration or 60)))
        run = lambda: run_open(spec, rate, n, opts.burstiness, warmup)  # noqa: E731
        return [progressed(f"rate {rate:g}/s", n + warmup, run)]
    results = []
    total = None if duration else opts.requests + warmup
    count = None if duration else opts.requests
    for c in opts.levels or [1]:
        r = progressed(f"concurrency {c}", total, lambda c=c: run_closed(spec, c, count, duration, warmup))
        results.append(r)
        if echo:
            ttft = r["ttft_ms"]["p50"] if r["ttft_ms"] else float("nan")
            echo(
                f"c={c}: {r['succeeded']} ok, {r['failed']} failed, "
                f"{r['output_tokens_per_s']:.1f} tok/s, TTFT p50 {ttft:.1f} ms"
            )
    return results


def target_record(spec: LoadSpec, source: dict[str, Any]) -> dict[str, Any]:
    """The report's `target`: what was measured and how the requests were made."""
    openai = spec.protocol == "openai"
    return {
        "url": spec.url,
        "model": spec.model,
        "protocol": spec.protocol,
        "input_len": spec.input_len,
        "output_len": spec.output_len,
        "input_len_std": spec.input_len_std,
        "output_len_std": spec.output_len_std,
        "dataset_prompts": len(spec.prompts),
        "vocab": list(spec.vocab),
        "seed": spec.seed,
        "prompts": source or {},
        "output_forced": spec.force_output,
        "input_tokens_from": "usage" if openai else "num_input_tokens" if spec.count_input else "client",
        **({"endpoint": spec.endpoint} if openai else {}),
    }


def show(doc: dict[str, Any], opts: BenchOptions, echo: Echo) -> None:
    """The report's Markdown, its notes and where its files went."""
    echo(report.markdown(doc))
    for note in ("plots_note", "roofline_note"):
        if note in doc:
            echo(doc[note])
    if opts.out is not None:
        echo(f"Wrote {opts.out}/results.json")
