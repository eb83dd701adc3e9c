"""`lpx bench`: sweep concurrency levels (closed loop) or one request rate (open loop) against a URL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from ..errors import PipelineError
from . import report
from .load import LoadSpec, run_closed, run_open
from .metrics import parse_slo, summarize


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PipelineError(f"Bad --concurrency {text!r} - use a comma list such as 1,4,16,64") from None
    if not levels or min(levels) < 1:
        raise PipelineError(f"Bad --concurrency {text!r} - every level must be >= 1")
    return levels


def bench(spec: LoadSpec, concurrency: list[int] | None = None, rate: float | None = None,
          burstiness: float = 1.0, requests: int | None = 100, duration_s: float | None = None,
          warmup: int = 10, slo: dict[str, float] | None = None, out: Path | None = None,
          echo: Any = None) -> dict[str, Any]:
    """Run the load against `spec.url` and return the report document; write it to `out` if given."""
    results = []
    if rate is not None:
        n = requests or max(1, int(rate * (duration_s or 60)))
        results.append(summarize(run_open(spec, rate, n, burstiness, warmup), slo))
    else:
        for c in concurrency or [1]:
            results.append(summarize(run_closed(spec, c, None if duration_s else requests, duration_s, warmup), slo))
            if echo:
                r = results[-1]
                echo(f"c={c}: {r['succeeded']} ok, {r['failed']} failed, "
                     f"{r['output_tokens_per_s']:.1f} tok/s, TTFT p50 "
                     f"{r['ttft_ms']['p50'] if r['ttft_ms'] else float('nan'):.1f} ms")
    doc = {"target": {"url": spec.url, "model": spec.model, "protocol": spec.protocol, "input_len": spec.input_len,
                      "output_len": spec.output_len, "vocab": list(spec.vocab), "seed": spec.seed},
           "results": results, "environment": report.environment(), "finished_at": time.time()}
    if out is not None:
        doc["files"] = {k: str(v) for k, v in report.write(doc, out).items()}
    return doc


@click.command("bench")
@click.option("--url", required=True, help="HOST:PORT of Triton's gRPC (or HTTP with --protocol http) endpoint.")
@click.option("--model", default="ensemble", show_default=True,
              help="'ensemble' (text prompts) or 'tensorrt_llm' (token ids, exact lengths).")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True)
@click.option("--concurrency", default="1,4,16,64", show_default=True, help="Closed-loop levels, comma separated.")
@click.option("--rate", type=float, default=None, help="Open loop: requests per second (replaces --concurrency).")
@click.option("--burstiness", type=float, default=1.0, show_default=True,
              help="Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier.")
@click.option("--requests", type=int, default=100, show_default=True, help="Counted requests per level.")
@click.option("--duration", type=float, default=None, help="Seconds per level instead of --requests.")
@click.option("--warmup", type=int, default=10, show_default=True, help="Uncounted requests before each level.")
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=128, show_default=True)
@click.option("--vocab", default="100,30000", show_default=True, help="Range LO,HI of random prompt token ids.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--slo", default=None, help="Goodput SLOs, e.g. ttft=200ms,itl=50ms.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Folder for results.json/.md/plots.")
def bench_command(url: str, model: str, protocol: str, concurrency: str, rate: float | None, burstiness: float,
                  requests: int, duration: float | None, warmup: int, input_len: int, output_len: int, vocab: str,
                  seed: int, slo: str | None, out: Path | None) -> None:
    """Measure a served model: TTFT, ITL, E2E, tokens/s and goodput per load level (warm-up excluded)."""
    try:
        lo, hi = (int(x) for x in vocab.split(","))
    except ValueError:
        raise PipelineError(f"Bad --vocab {vocab!r} - use LO,HI such as 100,30000") from None
    spec = LoadSpec(url=url, model=model, protocol=protocol, input_len=input_len, output_len=output_len,
                    vocab=(lo, hi), seed=seed)
    doc = bench(spec, None if rate is not None else parse_levels(concurrency), rate, burstiness, requests,
                duration, warmup, parse_slo(slo), out, echo=click.echo)
    click.echo(report.markdown(doc))
    if "plots_note" in doc:
        click.echo(doc["plots_note"])
    if out is not None:
        click.echo(f"Wrote {out}/results.json")
    if all(r["succeeded"] == 0 for r in doc["results"]):
        raise PipelineError(f"Every request failed against {url} - first errors: {doc['results'][0]['errors'][:2]}")
