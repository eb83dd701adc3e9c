"""The tool commands: `lpx bench`, `lpx compare`, `lpx doctor`, `lpx matrix`, `lpx plan`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..facts.models import PRESETS
from ..facts.trtllm import BUILD_LINES, LINES
from .options import (
    config_option,
    config_path_option,
    dataset_field_option,
    dataset_option,
    slo_option,
    variant_option,
)


@click.command("bench")
@click.option(
    "--url",
    default=None,
    help="HOST:PORT of Triton's gRPC (or HTTP with --protocol http) endpoint. "
    "Without it, -c/--variant: LPX runs the stages, starts the server, measures and stops it.",
)
@config_path_option(
    "lpx.yaml whose variant to serve and measure (default as 'lpx run': $LPX_CONFIG, ./lpx.yaml, demo)."
)
@click.option(
    "--model",
    default="ensemble",
    show_default=True,
    help="'ensemble' or 'tensorrt_llm_bls' (text prompts of --input-len tokens, counted with the served "
    "tokenizer) or 'tensorrt_llm' (token ids); with --api openai the model id (default: the server's first).",
)
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True)
@click.option(
    "--api",
    type=click.Choice(["triton", "openai"]),
    default="triton",
    show_default=True,
    help="openai: measure an OpenAI-compatible server (LPX's gateway or any other) at --url http://H:P "
    "(default: the running 'lpx serve''s gateway).",
)
@click.option(
    "--endpoint",
    type=click.Choice(["chat", "completions"]),
    default="chat",
    show_default=True,
    help="--api openai: /v1/chat/completions or /v1/completions.",
)
@click.option(
    "--api-key", default=None, help="--api openai: the Bearer key (default: $LPX_API_KEY, $OPENAI_API_KEY)."
)
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
@click.option("--input-len", type=int, default=128, show_default=True, help="Prompt tokens per request.")
@click.option(
    "--output-len",
    type=int,
    default=128,
    show_default=True,
    help="max_tokens per request; also min_tokens where the model honours it (forced length).",
)
@click.option(
    "--input-len-std",
    type=float,
    default=0.0,
    show_default=True,
    help="> 0: input lengths drawn per request from a normal distribution around --input-len.",
)
@click.option("--output-len-std", type=float, default=0.0, show_default=True)
@dataset_option
@dataset_field_option
@click.option(
    "--vocab",
    default=None,
    help="Range LO,HI of random prompt token ids (--model tensorrt_llm). Default: the served model's "
    "vocabulary (the config.json beside its tokenizer in the repository served, first 100 ids left out) "
    "when the repository is known (lpx bench -c, a local server, --tokenizer), else 100,30000.",
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="The served model's tokenizer folder, for prompts of exactly --input-len tokens (text models). "
    "Default: the served repository's preprocessing/1/tokenizer when the server runs on this machine; "
    "without one, prompts are common words of about --input-len tokens.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@slo_option("Goodput SLOs, e.g. ttft=200ms,itl=50ms.")
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
def bench(**options) -> None:
    """Measure a served model: TTFT, ITL, E2E, tokens/s and goodput per load level (warm-up excluded)."""
    from ..bench.options import BenchOptions
    from ..bench.sweep import measure

    measure(BenchOptions.from_options(options), echo=click.echo)


@click.command("compare")
@click.argument("runs", nargs=-1, type=click.Path(exists=True, path_type=Path))
@config_option
@variant_option
@click.option("--force", is_flag=True, help="Compare runs from different GPUs or load shapes anyway.")
@click.option(
    "--out", type=click.Path(path_type=Path), default=None, help="Folder for compare.md and compare.png."
)
@click.option(
    "--concurrency",
    default="1,4",
    show_default=True,
    help="-c: closed-loop levels each variant is measured at.",
)
@click.option(
    "--requests", type=click.IntRange(1), default=32, show_default=True, help="-c: requests per level."
)
@click.option(
    "--warmup", type=click.IntRange(0), default=4, show_default=True, help="-c: uncounted requests per level."
)
@click.option(
    "--input-len", type=click.IntRange(1), default=128, show_default=True, help="-c: prompt tokens."
)
@click.option(
    "--output-len", type=click.IntRange(1), default=64, show_default=True, help="-c: output tokens."
)
@click.option(
    "--model",
    default="tensorrt_llm",
    show_default=True,
    help="-c: the Triton model measured: tensorrt_llm (token ids, the engine alone) or ensemble (text).",
)
def compare(
    runs, config_path, variants, force, out, concurrency, requests, warmup, input_len, output_len, model
):
    """Put bench runs (folders from 'lpx bench --out') side by side: target, latency, throughput, quality,
    size. With -c instead: bench every variant of lpx.yaml alike, each served on its own build target
    (variants[].build.target), and compare them; a target that cannot serve here keeps its line with
    the reason."""
    from ..bench.compare import compare as compare_runs
    from ..bench.compare import compare_docs
    from ..errors import UsageError

    if runs and (config_path or variants):
        raise UsageError("give RUN_DIRs or -c/--variant, not both")
    if runs:
        result = compare_runs(list(runs), force, out)
    elif config_path is None and not variants:
        raise UsageError(
            "give RUN_DIRs (folders from 'lpx bench --out'), or -c lpx.yaml to measure its variants"
        )
    else:
        from ..bench.engines import measure_all
        from ..bench.options import BenchOptions
        from ..config import resolve_config
        from ..progress import Reporter

        cfg = resolve_config(config_path, Reporter())
        opts = BenchOptions(
            config_path=config_path,
            model=model,
            concurrency=concurrency,
            requests=requests,
            warmup=warmup,
            input_len=input_len,
            output_len=output_len,
        )
        opts.check()
        docs = measure_all(cfg, list(variants), opts, out, click.echo)
        result = compare_docs(docs, force, out)
    click.echo(result["markdown"])
    if out is not None:
        click.echo(f"Wrote {', '.join(result['files'].values())}")
        if "plot" not in result["files"]:
            click.echo("plot skipped: matplotlib is not installed, or no run was measured")


COLORS = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}


@click.command("doctor")
@click.option(
    "--trtllm",
    "target",
    type=click.Choice(list(LINES)),
    default=BUILD_LINES[0],
    show_default=True,
    help="TensorRT-LLM line to check the driver against.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (fields in `pydoc pipeline.inspection.doctor`)."
)
def doctor(target: str, as_json: bool) -> None:
    """Check the driver, GPUs, container, Triton and packages; exit 1 on any FAIL."""
    from ..errors import LpxError
    from ..inspection import doctor as checks

    result = checks.diagnose(target=target)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        for c in result["checks"]:
            click.echo(
                click.style(f"{c['status']:<4}", fg=COLORS[c["status"]], bold=True)
                + f"  {c['name']:<12} {c['detail']}"
            )
            if c["fix"]:
                click.echo(f"      {'':<12} fix: {c['fix']}")
    if not result["ok"]:
        failed = [c["name"] for c in result["checks"] if c["status"] == "FAIL"]
        if as_json:
            raise SystemExit(1)
        raise LpxError(f"{len(failed)} check(s) failed ({', '.join(failed)}) - apply the fix lines above")


@click.command("matrix")
@config_path_option("lpx.yaml to use (default: ./lpx.yaml).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "github"]),
    default="json",
    show_default=True,
    help="json: cells and excluded cells, pretty; github: one line for strategy.matrix.",
)
def matrix(config_path: Path | None, fmt: str) -> None:
    """Print the CI build matrix: one cell per variant x GPU arch the format can run on."""
    from ..config import load_config
    from ..inspection import matrix as cells

    result = cells.matrix(load_config(cells.config_path(config_path)))
    if fmt == "github":
        click.echo(json.dumps({"include": result["include"]}, separators=(",", ":")))
    else:
        click.echo(json.dumps(result, indent=2))


@click.command("plan")
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path, file_okay=False),
    help="HF checkpoint folder (reads config.json).",
)
@click.option(
    "--model-config", type=click.Path(path_type=Path, dir_okay=False), help="A HF config.json file."
)
@click.option("--preset", help=f"A known model: {', '.join(PRESETS)}.")
@click.option("--gpu", "gpu_name", help="GPU to plan for (h200, 'NVIDIA H100 80GB HBM3', l40s...).")
@click.option(
    "--seq-len",
    type=click.IntRange(1),
    default=2048,
    show_default=True,
    help="Expected tokens per sequence (prompt + output).",
)
@click.option("--max-seq-len", type=click.IntRange(1), help="Engine max_seq_len (default: --seq-len).")
@click.option(
    "--kv-fraction",
    type=click.FloatRange(0.01, 1.0),
    default=0.9,
    show_default=True,
    help="kv_cache_free_gpu_mem_fraction.",
)
@click.option(
    "--kv-cache", "kv_dtype", type=click.Choice(["bf16", "fp8", "int8"]), default="bf16", show_default=True
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (fields in `pydoc pipeline.inspection.plan`)."
)
def plan(
    checkpoint: Path | None,
    model_config: Path | None,
    preset: str | None,
    gpu_name: str | None,
    seq_len: int,
    max_seq_len: int | None,
    kv_fraction: float,
    kv_dtype: str,
    as_json: bool,
) -> None:
    """Weights, KV cache, how many sequences fit and decode speed, per quantization format."""
    from ..facts.gpu import lookup_gpu
    from ..inspection import plan as planning

    shape = planning.load_shape(checkpoint, model_config, preset)
    gpu = lookup_gpu(gpu_name) if gpu_name else None
    result = planning.plan(shape, gpu, seq_len, kv_fraction, max_seq_len, kv_dtype)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        planning.render(result)
