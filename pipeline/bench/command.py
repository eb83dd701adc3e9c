"""`lpx bench`: sweep concurrency levels (closed loop) or one request rate (open loop) against a URL."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import click

from ..errors import PipelineError
from . import report, roofline
from .compare import _artifacts, parse_variant
from .load import COUNT_INPUT, ENGINE, LoadSpec, model_inputs, run_closed, run_open
from .metrics import parse_slo, summarize


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PipelineError(f"Bad --concurrency {text!r} - use a comma list such as 1,4,16,64") from None
    if not levels or min(levels) < 1:
        raise PipelineError(f"Bad --concurrency {text!r} - every level must be >= 1")
    return levels


def bench(
    spec: LoadSpec,
    concurrency: list[int] | None = None,
    rate: float | None = None,
    burstiness: float = 1.0,
    requests: int | None = 100,
    duration_s: float | None = None,
    warmup: int = 10,
    slo: dict[str, float] | None = None,
    out: Path | None = None,
    echo: Any = None,
    label: str | None = None,
    variant: dict[str, Any] | None = None,
    roof: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the load against `spec.url` and return the report document; write it to `out` if given.
    `label` and `variant` ({'model', 'name', 'artifact'}) are recorded for `lpx compare`; `roof`
    ({'gpu', 'checkpoint', 'format', 'kv_dtype'}) adds the decode roofline (see roofline_inputs)."""
    from ..progress import Reporter

    bar = Reporter()
    results = []
    if spec.model != ENGINE and not spec.count_tokens:  # count tokens, not responses, where the model can
        spec.count_tokens = COUNT_INPUT in (model_inputs(spec) or ())

    def progressed(label: str, total: int | None, run):
        with bar.task(label, total) as advance:
            spec.on_done = lambda _rec: advance()
            try:
                return run()
            finally:
                spec.on_done = None

    if rate is not None:
        n = requests or max(1, int(rate * (duration_s or 60)))
        results.append(
            summarize(
                progressed(
                    f"rate {rate:g}/s", n + warmup, lambda: run_open(spec, rate, n, burstiness, warmup)
                ),
                slo,
            )
        )
    else:
        for c in concurrency or [1]:
            total = None if duration_s else requests + warmup
            results.append(
                summarize(
                    progressed(
                        f"concurrency {c}",
                        total,
                        lambda c=c: run_closed(spec, c, None if duration_s else requests, duration_s, warmup),
                    ),
                    slo,
                )
            )
            if echo:
                r = results[-1]
                echo(
                    f"c={c}: {r['succeeded']} ok, {r['failed']} failed, "
                    f"{r['output_tokens_per_s']:.1f} tok/s, TTFT p50 "
                    f"{r['ttft_ms']['p50'] if r['ttft_ms'] else float('nan'):.1f} ms"
                )
    doc = {
        "target": {
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
        },
        "results": results,
        "environment": report.environment(),
        "finished_at": time.time(),
    }
    if label:
        doc["label"] = label
    if variant:
        doc["variant"] = variant
    if roof is not None:
        try:
            args = roofline_inputs(doc, **roof)
            if isinstance(args, str):
                doc["roofline_note"] = args
            else:
                roofline.roofline(doc, *args)
        except PipelineError as exc:
            doc["roofline_note"] = f"roofline skipped: {exc}"
    if out is not None:
        doc["files"] = {k: str(v) for k, v in report.write(doc, out).items()}
    return doc


def roofline_inputs(
    doc: dict[str, Any],
    gpu: str | None = None,
    checkpoint: Path | None = None,
    format: str | None = None,
    kv_dtype: str | None = None,
) -> tuple | str:
    """(Gpu, checkpoint, format, kv dtype) for the roofline, from the options or the variant's quantize
    manifest; a note saying what is missing otherwise."""
    g = roofline.detect_gpu(doc["environment"].get("gpus") or [], gpu)
    variant = doc.get("variant") or {}
    if (checkpoint is None or format is None) and variant.get("name"):
        from ..artifacts import Store

        found = _artifacts(Store(), variant, "quantize")
        if found:
            res = found[0].manifest.get("results", {})
            checkpoint = checkpoint or found[0].path
            format = format or res.get("format")
            kv_dtype = kv_dtype or roofline.kv_dtype_of(res.get("kv_cache"))
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


@contextlib.contextmanager
def _served(config_path: Path | None, variant_name: str | None, protocol: str):
    """Run the stages for one variant, serve its repository on 127.0.0.1, yield (url, variant info), stop."""
    from ..cli import _config
    from ..progress import Reporter
    from ..runner import Runner
    from ..stages.serve import _server
    from ..stages.serve.selection import choose

    report = Reporter()
    cfg = _config(config_path, report)
    variants = cfg.select([variant_name] if variant_name else None)
    if len(variants) != 1:
        raise PipelineError(
            "lpx bench -c measures one variant; pick it with --variant "
            f"(have: {', '.join(v.name for v in variants)})",
            exit_code=2,
        )
    runner = Runner(cfg, report)
    outcome = runner.run(variants, "repo")[0]
    runner.raise_gate_failures()
    picked = choose(outcome)
    if picked is None:
        raise PipelineError(
            f"variant '{variants[0].name}' has no model repository to serve - see the messages above"
        )
    engine, repo = picked
    with _server(cfg, variants[0].name, repo) as server:
        report.stage("serve", variants[0].name, f"ready: gRPC {server.grpc_url}, HTTP {server.http_url}")
        yield (
            server.grpc_url if protocol == "grpc" else server.http_url,
            {
                "model": cfg.model.name,
                "name": variants[0].name,
                "artifact": engine.path,
                "provenance": {
                    "config": cfg.model_dump(mode="json"),
                    "artifact_keys": {k: a.key for k, a in outcome.artifacts.items()},
                },
            },
        )


@click.command("bench")
@click.option(
    "--url",
    default=None,
    help="HOST:PORT of Triton's gRPC (or HTTP with --protocol http) endpoint. "
    "Without it, -c/--variant: LPX runs the stages, starts the server, measures and stops it.",
)
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="lpx.yaml whose variant to serve and measure (default as 'lpx run': $LPX_CONFIG, ./lpx.yaml, demo).",
)
@click.option(
    "--model",
    default="ensemble",
    show_default=True,
    help="'ensemble' (text prompts) or 'tensorrt_llm' (token ids, exact lengths).",
)
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True)
@click.option(
    "--concurrency", default="1,4,16,64", show_default=True, help="Closed-loop levels, comma separated."
)
@click.option(
    "--rate", type=float, default=None, help="Open loop: requests per second (replaces --concurrency)."
)
@click.option(
    "--burstiness",
    type=float,
    default=1.0,
    show_default=True,
    help="Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier.",
)
@click.option("--requests", type=int, default=100, show_default=True, help="Counted requests per level.")
@click.option("--duration", type=float, default=None, help="Seconds per level instead of --requests.")
@click.option(
    "--warmup", type=int, default=10, show_default=True, help="Uncounted requests before each level."
)
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=128, show_default=True)
@click.option(
    "--input-len-std",
    type=float,
    default=0.0,
    show_default=True,
    help="> 0: input lengths drawn per request from a normal distribution around --input-len.",
)
@click.option("--output-len-std", type=float, default=0.0, show_default=True)
@click.option(
    "--dataset",
    type=click.Path(path_type=Path),
    default=None,
    help="Prompts from a local .txt (one per paragraph) or .jsonl file (text models only).",
)
@click.option(
    "--dataset-field", default="prompt", show_default=True, help="The .jsonl field holding the prompt."
)
@click.option(
    "--vocab", default="100,30000", show_default=True, help="Range LO,HI of random prompt token ids."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--slo", default=None, help="Goodput SLOs, e.g. ttft=200ms,itl=50ms.")
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Folder for results.json/.md/plots."
)
@click.option(
    "--label", default=None, help="Name of this run in 'lpx compare' (default: the variant or folder)."
)
@click.option(
    "--variant",
    "variant_ref",
    default=None,
    help="VARIANT or MODEL/VARIANT served: 'lpx compare' adds its eval quality and size on disk.",
)
@click.option(
    "--artifact",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="The artifact folder served (engine or checkpoint), for its size on disk.",
)
@click.option("--gpu", default=None, help="GPU for the decode roofline (default: detected with nvidia-smi).")
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="HF checkpoint folder (config.json) for the roofline's weight and KV bytes.",
)
@click.option(
    "--format", "fmt", default=None, help="Weight format for the roofline: none, fp8, int4_awq, ..."
)
@click.option(
    "--kv-dtype", type=click.Choice(["bf16", "fp8", "int8"]), default=None, help="KV cache dtype [bf16]."
)
def bench_command(
    url: str | None,
    config_path: Path | None,
    model: str,
    protocol: str,
    concurrency: str,
    rate: float | None,
    burstiness: float,
    requests: int,
    duration: float | None,
    warmup: int,
    input_len: int,
    output_len: int,
    vocab: str,
    seed: int,
    slo: str | None,
    out: Path | None,
    label: str | None,
    variant_ref: str | None,
    artifact: Path | None,
    gpu: str | None,
    checkpoint: Path | None,
    fmt: str | None,
    kv_dtype: str | None,
    input_len_std: float = 0.0,
    output_len_std: float = 0.0,
    dataset: Path | None = None,
    dataset_field: str = "prompt",
    provenance: dict | None = None,
) -> None:
    """Measure a served model: TTFT, ITL, E2E, tokens/s and goodput per load level (warm-up excluded)."""
    try:
        lo, hi = (int(x) for x in vocab.split(","))
    except ValueError:
        raise PipelineError(f"Bad --vocab {vocab!r} - use LO,HI such as 100,30000") from None
    if url is None:
        with _served(config_path, variant_ref, protocol) as (url, served):
            return bench_command.callback(
                url,
                None,
                model,
                protocol,
                concurrency,
                rate,
                burstiness,
                requests,
                duration,
                warmup,
                input_len,
                output_len,
                vocab,
                seed,
                slo,
                out,
                label or served["name"],
                f"{served['model']}/{served['name']}",
                served["artifact"],
                gpu,
                checkpoint,
                fmt,
                kv_dtype,
                input_len_std,
                output_len_std,
                dataset,
                dataset_field,
                provenance=served["provenance"],
            )
    prompts: tuple[str, ...] = ()
    if dataset is not None:
        if model == "tensorrt_llm":
            raise PipelineError(
                "--dataset gives text prompts: use it with --model ensemble or tensorrt_llm_bls", 2
            )
        from ..stages.quantize.calibration import read_texts

        prompts = tuple(read_texts(dataset, dataset_field, "--dataset", "--dataset-field")[0])
        if not prompts:
            raise PipelineError(f"--dataset: {dataset} holds no prompts", exit_code=2)
    spec = LoadSpec(
        url=url,
        model=model,
        protocol=protocol,
        input_len=input_len,
        output_len=output_len,
        input_len_std=input_len_std,
        output_len_std=output_len_std,
        vocab=(lo, hi),
        seed=seed,
        prompts=prompts,
    )
    variant: dict[str, Any] | None = parse_variant(variant_ref) if variant_ref else None
    if artifact is not None:
        variant = {**(variant or {"model": None, "name": None}), "artifact": str(artifact.resolve())}
    if provenance:  # the config and the key of every artifact behind the served repository
        variant = {**(variant or {}), **provenance}
    if gpu:
        roofline.lookup_gpu(gpu)  # an unknown name fails before the load runs
    roof = {"gpu": gpu, "checkpoint": checkpoint, "format": fmt, "kv_dtype": kv_dtype}
    doc = bench(
        spec,
        None if rate is not None else parse_levels(concurrency),
        rate,
        burstiness,
        requests,
        duration,
        warmup,
        parse_slo(slo),
        out,
        echo=click.echo,
        label=label,
        variant=variant,
        roof=roof,
    )
    click.echo(report.markdown(doc))
    for note in ("plots_note", "roofline_note"):
        if note in doc:
            click.echo(doc[note])
    if out is not None:
        click.echo(f"Wrote {out}/results.json")
    if all(r["succeeded"] == 0 for r in doc["results"]):
        raise PipelineError(
            f"Every request failed against {url} - first errors: {doc['results'][0]['errors'][:2]}"
        )
