"""`lpx`: thin click commands over the stages. Errors become one clear message and an exit code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from .. import __version__
from ..config import STAGES, Config, dump_config, json_schema, load_config
from ..errors import PipelineError
from ..progress import Reporter, stdout_console


def _config(path: Path | None, report: Reporter) -> Config:
    if path is None and os.environ.get("LPX_CONFIG"):
        path = Path(os.environ["LPX_CONFIG"])
    if path is None and Path("lpx.yaml").is_file():
        path = Path("lpx.yaml")
        report.info("using ./lpx.yaml")
    if path is None:
        from ..demo import ensure_demo

        report.info("no -c given: running the built-in demo (a tiny Llama, FP8, torch target)")
        path = ensure_demo(report)
    return load_config(path)


config_option = click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="lpx.yaml to use (default: $LPX_CONFIG, ./lpx.yaml, else the built-in demo).",
)
variant_option = click.option(
    "--variant", "variants", multiple=True, help="Only these variants (repeatable)."
)
force_option = click.option("--force", is_flag=True, help="Re-run the stage even if a cached result matches.")
skip_gate_option = click.option(
    "--skip-gate", is_flag=True, help="Build variants that fail quality_gate (with a warning)."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lpx")
def cli() -> None:
    """LPX: quantize, build, serve and measure small LLMs with ModelOpt, TensorRT-LLM and Triton."""


@cli.command()
@click.argument("directory", type=click.Path(path_type=Path))
def init(directory: Path) -> None:
    """Write the demo's lpx.yaml and its tiny checkpoint into DIRECTORY."""
    from ..demo import ensure_checkpoint, write_demo_config

    if (directory / "lpx.yaml").exists():
        raise PipelineError(f"{directory / 'lpx.yaml'} already exists - choose an empty folder", exit_code=2)
    ensure_checkpoint(directory / "checkpoint")
    path = write_demo_config(directory)
    click.echo(f"wrote {path} and {directory / 'checkpoint'}\nnext: lpx run -c {path}")


@cli.command()
@config_option
@variant_option
@click.option(
    "--until", type=click.Choice(STAGES), default="serve", show_default=True, help="Last stage to run."
)
@force_option
@skip_gate_option
def run(config_path, variants, until, force, skip_gate) -> None:
    """Run the stages in order; `serve` starts Triton, streams one completion and stops."""
    report = Reporter()
    cfg = _config(config_path, report)
    _run(cfg, variants, until, set(STAGES) if force else set(), report, smoke=True, skip_gate=skip_gate)


def _run(
    cfg: Config,
    variants,
    until: str,
    force: set[str],
    report: Reporter,
    smoke: bool,
    skip_gate: bool = False,
    dry_run: bool = False,
) -> list:
    from ..runner import Runner

    selected = cfg.select(variants)
    if until == "serve":
        from ..stages.serve import preflight

        preflight(cfg)
    runner = Runner(cfg, report, force, skip_gate=skip_gate, dry_run=dry_run)
    outcomes = runner.run(selected, until)
    if until == "eval":
        from ..report import eval_table

        stdout_console().print(eval_table(outcomes, cfg))
    runner.raise_gate_failures()
    if until != "serve":
        return outcomes
    from ..stages.serve import serve_and_check, serve_forever_repo
    from ..stages.serve.selection import choose

    # refuses an engine of another arch or TensorRT-LLM version before Triton starts
    chosen = {o.variant: pick[1] for o in outcomes if (pick := choose(o)) is not None}
    if not chosen:
        raise PipelineError("Nothing to serve: no variant has a model repository - see the messages above")
    if smoke:
        for variant, repo in chosen.items():
            serve_and_check(cfg, variant, repo, report, stdout_console())
        return outcomes
    if len(chosen) != 1:
        raise PipelineError(
            f"'lpx serve' serves one variant; pick one with --variant (have: {', '.join(chosen)})", 2
        )
    ((variant, repo),) = chosen.items()
    serve_forever_repo(cfg, variant, repo, report)
    return outcomes


def _stage_command(stage: str, doc: str, dry_run: bool = False):
    @cli.command(name=stage, help=doc)
    @config_option
    @variant_option
    @force_option
    @skip_gate_option
    def command(config_path, variants, force, skip_gate, **extra) -> None:
        report = Reporter()
        cfg = _config(config_path, report)
        _run(
            cfg,
            variants,
            stage,
            {stage} if force else set(),
            report,
            smoke=False,
            skip_gate=skip_gate,
            dry_run=extra.get("dry_run", False),
        )

    if dry_run:
        command = click.option(
            "--dry-run", is_flag=True, help="Print the build command and why each flag is set; build nothing."
        )(command)
    return command


_stage_command("quantize", "Quantize each variant with ModelOpt and export its checkpoints.")
_stage_command(
    "eval",
    "Measure each variant against the unquantized model (KL, top-1 agreement, perplexity) "
    "and apply quality_gate.",
)
_stage_command(
    "build",
    "Build the engine of each variant per GPU arch (runs quantize and eval first where needed).",
    dry_run=True,
)
_stage_command(
    "repo", "Write the Triton model repository of each variant (runs earlier stages where needed)."
)


@cli.command()
@config_option
@variant_option
@force_option
@skip_gate_option
@click.option("--host", default=None, help="Address to bind (default: serving.host, 127.0.0.1).")
def serve(config_path, variants, force, skip_gate, host) -> None:
    """Serve one variant's repository with tritonserver until Ctrl-C."""
    report = Reporter()
    cfg = _config(config_path, report)
    if host:
        cfg.serving.host = host
    _run(cfg, variants, "serve", {"serve"} if force else set(), report, smoke=False, skip_gate=skip_gate)


@cli.command()
@click.argument("prompt")
@click.option(
    "--url",
    help="host:port of Triton (gRPC port, or HTTP port with --http). Default: the running 'lpx serve'.",
)
@click.option("--model", default="ensemble", show_default=True)
@click.option("--max-tokens", default=64, show_default=True, type=int)
@click.option("--temperature", type=float, default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--http", "use_http", is_flag=True, help="Use HTTP generate_stream instead of gRPC streaming.")
def generate(prompt, url, model, max_tokens, temperature, top_k, top_p, use_http) -> None:
    """Stream a completion for PROMPT, printing tokens as they arrive."""
    from ..client import generate_stream
    from ..stages.serve import running_server

    if url is None:
        info = running_server()
        url = info["http_url"] if use_http else info["grpc_url"]
    params = {
        k: v for k, v in {"temperature": temperature, "top_k": top_k, "top_p": top_p}.items() if v is not None
    }
    for chunk in generate_stream(
        url, prompt, max_tokens, model=model, protocol="http" if use_http else "grpc", **params
    ):
        click.echo(chunk.text, nl=False)
    click.echo()


@cli.group()
def config() -> None:
    """Validate, show and describe lpx.yaml."""


@config.command()
@config_option
def validate(config_path) -> None:
    """Check a config; print every problem as `path: message` and exit 2 if any."""
    cfg = load_config(config_path or Path("lpx.yaml"))
    click.echo(f"ok: model {cfg.model.name}, {len(cfg.variants)} variant(s), target {cfg.build.target}")


@config.command()
@config_option
def show(config_path) -> None:
    """Print the resolved config, defaults filled in."""
    click.echo(dump_config(_config(config_path, Reporter())), nl=False)


@config.command()
def schema() -> None:
    """Print the JSON schema of lpx.yaml (for editors)."""
    click.echo(json.dumps(json_schema(), indent=2))


@cli.group()
def artifacts() -> None:
    """List and locate stage outputs (under $LPX_HOME/artifacts)."""


@artifacts.command(name="list")
@click.option("--json", "as_json", is_flag=True)
def artifacts_list(as_json) -> None:
    """Every complete artifact: stage, model, variant, arch, key, age, path."""
    from ..artifacts import Store

    arts = Store().all()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {k: a.manifest[k] for k in ("stage", "model", "variant", "arch", "key", "created")}
                    | {"path": str(a.path)}
                    for a in arts
                ],
                indent=2,
            )
        )
        return
    if not arts:
        click.echo("no artifacts yet - run 'lpx run'")
    for a in arts:
        m = a.manifest
        click.echo(f"{m['stage']:<9} {m['model']}/{m['variant']}/{m['arch']}  {m['key']}  {a.path}")


@artifacts.command(name="path")
@click.option("--stage", type=click.Choice(["quantize", "build", "repo"]), default=None)
@click.option("--model", default=None)
@click.option("--variant", default=None)
@click.option("--arch", default=None)
def artifacts_path(stage, model, variant, arch) -> None:
    """Print the artifact root, or the newest artifact matching the filters."""
    from ..artifacts import Store

    store = Store()
    if not any((stage, model, variant, arch)):
        click.echo(store.root)
        return
    arts = [
        a
        for a in store.all()
        if (stage is None or a.stage == stage)
        and (model is None or a.manifest["model"] == model)
        and (variant is None or a.manifest["variant"] == variant)
        and (arch is None or a.manifest["arch"] == arch)
    ]
    if not arts:
        raise PipelineError("No artifact matches - 'lpx artifacts list' shows what exists", exit_code=1)
    click.echo(max(arts, key=lambda a: a.manifest.get("created", 0)).path)


@cli.command()
def path() -> None:
    """Print LPX_HOME, where all LPX state lives."""
    from ..artifacts import home

    click.echo(home())


def _register_tools() -> None:
    from ..bench.command import bench_command
    from ..bench.compare import compare_command
    from ..inspection.doctor import doctor_command
    from ..inspection.matrix import matrix_command
    from ..inspection.plan import plan_command

    cli.add_command(bench_command)
    cli.add_command(compare_command)
    cli.add_command(doctor_command)
    cli.add_command(matrix_command)
    cli.add_command(plan_command)


_register_tools()


def main() -> None:
    os.environ.setdefault(
        "TRANSFORMERS_VERBOSITY", "error"
    )  # the runner silences the rest when it loads them
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    debug = bool(os.environ.get("LPX_DEBUG"))
    try:
        cli.main(standalone_mode=False)
    except PipelineError as exc:
        click.secho(f"error: {exc.message}", err=True, fg="red")
        if exc.detail:
            click.echo(exc.detail, err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if debug:
            raise
        click.secho(f"error: unexpected {type(exc).__name__}: {exc}", err=True, fg="red")
        click.echo(
            "This is a bug or an unsupported setup; re-run with LPX_DEBUG=1 for the traceback.", err=True
        )
        sys.exit(1)
