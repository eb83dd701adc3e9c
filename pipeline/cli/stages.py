"""The stage commands: `lpx run` and one command per stage, `lpx serve` and `lpx generate`."""

from __future__ import annotations

from pathlib import Path

import click

from ..stages import STAGES
from .options import config_option, force_option, skip_gate_option, variant_option


def _run(
    config_path,
    variants,
    until: str,
    force: set[str],
    smoke: bool,
    skip_gate: bool = False,
    dry_run: bool = False,
    host: str | None = None,
    gateway: bool = True,
    log_stdout: bool = False,
) -> None:
    """Run the stages up to `until` and, for `serve`, serve what they built (`smoke`: one completion)."""
    from ..config import resolve_config
    from ..progress import Reporter, stdout_console

    report = Reporter()
    cfg = resolve_config(config_path, report)  # a bad lpx.yaml is refused before torch & co. load (~10 s)
    from .. import served as serve
    from ..runner import Runner

    if host:
        cfg.serving.host = host
    if not gateway:
        cfg.serving.openai.enabled = False
    if log_stdout:
        cfg.serving.log_stdout = True
    selected = cfg.select(variants)
    if until == "serve":
        serve.preflight(cfg)  # no tritonserver or a busy port: refused before quantizing anything
    runner = Runner(cfg, report, force, skip_gate=skip_gate, dry_run=dry_run)
    outcomes = runner.run(selected, until)
    if until == "eval":
        stdout_console().print(eval_table(outcomes, cfg))
    runner.raise_gate_failures()
    if until == "serve":
        serve.serve(cfg, outcomes, report, stdout_console(), smoke)


def eval_table(outcomes, cfg):
    """The quality table `lpx eval` prints."""
    from rich.table import Table

    from ..stages.evaluate import gate_failures, gate_summary

    t = Table(
        title=f"{cfg.model.name}: quality vs the unquantized model (held-out text)",
        caption=gate_summary(cfg.quality_gate),
    )
    for col in ("variant", "format", "KL mean", "top-1 agree", "ppl base", "ppl quant", "ppl +%", "gate"):
        t.add_column(col, justify="left" if col in ("variant", "format", "gate") else "right")
    for o in outcomes:
        art = o.artifacts.get("eval")
        if art is None:
            continue
        r = art.manifest["results"]
        failures = gate_failures(r, cfg.quality_gate)
        fmt = cfg.variant(o.variant).quantization.format
        if "skipped" in r:
            t.add_row(o.variant, fmt, *["n/a"] * 5, "[red]FAIL[/red]" if failures else "not evaluated")
            continue
        t.add_row(
            o.variant,
            fmt,
            f"{r['kl_mean']:.5f}",
            f"{100 * r['top1_agreement']:.2f}%",
            f"{r['ppl_baseline']:.3f}",
            f"{r['ppl_quantized']:.3f}",
            f"{r['ppl_increase_pct']:+.2f}",
            "[red]FAIL[/red]" if failures else "pass",
        )
    return t


@click.command()
@config_option
@variant_option
@click.option(
    "--until", type=click.Choice(STAGES), default="serve", show_default=True, help="Last stage to run."
)
@force_option
@skip_gate_option
def run(config_path, variants, until, force, skip_gate) -> None:
    """Run the stages in order; `serve` starts Triton, streams one completion and stops."""
    _run(config_path, variants, until, set(STAGES) if force else set(), smoke=True, skip_gate=skip_gate)


def _stage_command(stage: str, doc: str, dry_run: bool = False) -> click.Command:
    @click.command(name=stage, help=doc)
    @config_option
    @variant_option
    @force_option
    @skip_gate_option
    def command(config_path, variants, force, skip_gate, **extra) -> None:
        _run(
            config_path,
            variants,
            stage,
            {stage} if force else set(),
            smoke=False,
            skip_gate=skip_gate,
            dry_run=extra.get("dry_run", False),
        )

    if dry_run:
        command = click.option(
            "--dry-run", is_flag=True, help="Print the build command and why each flag is set; build nothing."
        )(command)
    return command


quantize = _stage_command("quantize", "Quantize each variant with ModelOpt and export its checkpoints.")
eval_ = _stage_command(
    "eval",
    "Measure each variant against the unquantized model (KL, top-1 agreement, perplexity) "
    "and apply quality_gate.",
)
build = _stage_command(
    "build",
    "Build the engine of each variant per GPU arch (runs quantize and eval first where needed).",
    dry_run=True,
)
repo = _stage_command(
    "repo", "Write the Triton model repository of each variant (runs earlier stages where needed)."
)


@click.command()
@config_option
@variant_option
@force_option
@skip_gate_option
@click.option("--host", default=None, help="Address to bind (default: serving.host, 127.0.0.1).")
@click.option(
    "--repo",
    "repo_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Serve a packaged repository instead (an unpacked lpx-repos.tgz or one repository folder); "
    "no config needed, the repository built for this GPU is chosen.",
)
@click.option("--model", "model_name", default=None, help="With --repo: the model, when it holds several.")
@click.option("--no-gateway", is_flag=True, help="Serve Triton alone, without the OpenAI gateway.")
@click.option(
    "--ports",
    default=None,
    help="With --repo: HTTP,gRPC,metrics,OpenAI ports (default 8000,8001,8002,9000; 0 picks a free one).",
)
@click.option(
    "--log-stdout",
    is_flag=True,
    help="Copy tritonserver's log to stdout too (a container: kubectl logs); sets serving.log_stdout.",
)
def serve(
    config_path, variants, force, skip_gate, host, repo_dir, model_name, no_gateway, ports, log_stdout
) -> None:
    """Serve one variant's repository with tritonserver (and the OpenAI gateway) until Ctrl-C."""
    if repo_dir is not None:
        from ..errors import UsageError
        from ..served import serve_packaged

        if config_path is not None or len(variants) > 1:
            raise UsageError(
                "--repo serves a packaged repository without a config: drop -c, give one --variant"
            )
        chosen = None
        if ports:
            try:
                chosen = dict(
                    zip(("http", "grpc", "metrics", "openai"), map(int, ports.split(",")), strict=True)
                )
            except ValueError:
                raise UsageError(f"--ports {ports!r}: give four ports, e.g. 8000,8001,8002,9000") from None
        serve_packaged(
            repo_dir,
            variants[0] if variants else None,
            model_name,
            host,
            gateway=not no_gateway,
            ports=chosen,
            log_stdout=log_stdout,
        )
        return
    _run(
        config_path,
        variants,
        "serve",
        {"serve"} if force else set(),
        smoke=False,
        skip_gate=skip_gate,
        host=host,
        gateway=not no_gateway,
        log_stdout=log_stdout,
    )


@click.command()
@click.argument("prompt")
@click.option(
    "--url",
    help="host:port of Triton (gRPC port, or HTTP port with --http). Default: the running 'lpx serve'.",
)
@click.option("--model", default="ensemble", show_default=True)
@click.option("--max-tokens", default=64, show_default=True, type=int)
@click.option("--temperature", type=float, default=None, help="Default: greedy.")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--http", "use_http", is_flag=True, help="Use HTTP generate_stream instead of gRPC streaming.")
@click.option(
    "--api",
    type=click.Choice(["triton", "openai"]),
    default="triton",
    show_default=True,
    help="openai: the OpenAI API of LPX's gateway (or any compatible server); --url is then http://H:P.",
)
@click.option("--chat", is_flag=True, help="--api openai: /v1/chat/completions (PROMPT as one user message).")
@click.option(
    "--api-key", default=None, help="--api openai: the key (default: $LPX_API_KEY, $OPENAI_API_KEY)."
)
def generate(prompt, url, model, max_tokens, temperature, top_k, top_p, use_http, api, chat, api_key) -> None:
    """Stream a completion for PROMPT, printing tokens as they arrive."""
    from ..client import generate_stream, openai_stream
    from ..served import running_server

    params = {
        k: v for k, v in {"temperature": temperature, "top_k": top_k, "top_p": top_p}.items() if v is not None
    }
    if api == "openai":
        from ..client import api_key as find_key
        from ..errors import NotFound

        if url is None:
            url = running_server().get("openai_url")
            if not url:
                raise NotFound(
                    "The running 'lpx serve' has no OpenAI gateway - enable serving.openai or pass --url"
                )
        chunks = openai_stream(
            url,
            prompt,
            max_tokens,
            model=None if model == "ensemble" else model,
            chat=chat,
            api_key=find_key(api_key),
            **{"temperature": 0.0, **params},  # greedy unless asked, as the Triton path decodes
        )
    else:
        if url is None:
            info = running_server()
            url = info["http_url"] if use_http else info["grpc_url"]
        chunks = generate_stream(
            url, prompt, max_tokens, model=model, protocol="http" if use_http else "grpc", **params
        )
    for chunk in chunks:
        click.echo(chunk.text, nl=False)
    click.echo()
