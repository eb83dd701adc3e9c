"""`lpx tune`: the variant and build limits that serve an SLO best, by measurement."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_option, dataset_field_option, dataset_option, slo_option, variant_option


@click.command("tune")
@config_option
@variant_option
@slo_option(
    "The latency SLO, e.g. ttft=200ms,itl=30ms (repeatable: one answer per SLO; default tune.slo).",
    multiple=True,
    required=True,
)
@click.option(
    "--isl", type=click.IntRange(1), default=None, help="Prompt tokens per request (tune.input_len)."
)
@click.option(
    "--osl", type=click.IntRange(1), default=None, help="Output tokens per request (tune.output_len)."
)
@dataset_option
@dataset_field_option
@click.option("--requests", type=click.IntRange(4), default=None, help="Requests per load level.")
@click.option("--budget", default=None, help="Stop starting cells after this long, e.g. 2h, 90m.")
@click.option(
    "--endpoint",
    "endpoints",
    multiple=True,
    help="NAME=http://HOST:PORT: also measure this OpenAI-compatible server (vLLM, trtllm-serve, ...) "
    "as it runs (repeatable).",
)
@click.option("--endpoints-only", is_flag=True, help="Measure only the --endpoint servers, build nothing.")
@click.option(
    "--api-key", default=None, help="Key for the --endpoint servers (default $LPX_API_KEY, $OPENAI_API_KEY)."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("lpx-tune"),
    show_default=True,
    help="Folder for tune.md, tune.json, the plots and lpx.tuned.yaml.",
)
def tune(
    config_path,
    variants,
    slos,
    isl,
    osl,
    dataset,
    dataset_field,
    requests,
    budget,
    endpoints,
    endpoints_only,
    api_key,
    out,
) -> None:
    """Search the config's variants x a grid of build limits (tune.grid, else around what `lpx plan`
    says fits) for the most goodput at an SLO: each cell is built, served and loaded at rising
    concurrency, then Poisson rates, until the SLO breaks. Writes the Pareto front over quality,
    goodput and memory, the best cell per SLO and a ready lpx.yaml. Cells are cached: a second run
    (or one after an interruption) measures only what is missing."""
    from ..config import resolve_config
    from ..errors import UsageError
    from ..progress import Reporter
    from ..tune.run import Options, parse_budget
    from ..tune.run import tune as run_tune

    report = Reporter()
    cfg = resolve_config(config_path, report)
    updates = {"input_len": isl, "output_len": osl, "requests_per_level": requests}
    for name, value in updates.items():
        if value is not None:
            setattr(cfg.tune, name, value)
    if endpoints_only and not endpoints:
        raise UsageError("--endpoints-only needs at least one --endpoint NAME=URL")
    chosen = list(slos) or ([cfg.tune.slo] if cfg.tune.slo else [])
    run_tune(
        cfg,
        Options(
            slos=chosen,
            out=out,
            endpoints=list(endpoints),
            only_endpoints=endpoints_only,
            budget_s=parse_budget(budget),
            api_key=api_key,
            variants=list(variants),
            dataset=dataset,
            dataset_field=dataset_field,
        ),
        report,
        click.echo,
    )
