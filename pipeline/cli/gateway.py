"""`lpx gateway`: the OpenAI gateway alone, in front of a Triton that serves a packaged repository (the
Kubernetes sidecar; `lpx serve` starts the same gateway itself). Its settings come from lpx.yaml's
serving.openai (-c), the one source `lpx serve` and `lpx deploy` use too (pipeline/gateway/settings.py)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import config_path_option


@click.command("gateway")
@click.option(
    "--triton", "triton_url", required=True, help="Triton's gRPC HOST:PORT (a sidecar: 127.0.0.1:8001)."
)
@click.option(
    "--repo",
    "repo_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="The packaged repository Triton serves (for the tokenizer, the model's name and limits).",
)
@config_path_option(
    "lpx.yaml whose serving.openai settings the gateway runs with (default: that section's defaults)."
)
@click.option("--variant", default=None, help="The variant, when the folder holds several.")
@click.option("--model", "model_name", default=None, help="The model, when the folder holds several.")
@click.option(
    "--arch",
    default=None,
    help="Serve the repository built for this GPU arch (e.g. sm90) without looking for a GPU: the "
    "sidecar has none (lpx deploy writes it). Default: the GPU present.",
)
@click.option("--host", default=None, help="Address to bind.  [default: serving.openai.host, else 127.0.0.1]")
@click.option("--port", default=None, type=click.IntRange(0, 65535), help="[default: serving.openai.port]")
@click.option(
    "--keys",
    "keys_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Hashed API keys (lpx keys).  [default: serving.openai.api_keys_file]",
)
@click.option(
    "--access-log",
    default=None,
    help="A file for one JSON line per request, or - for stdout.  [default: serving.openai.access_log, else -]",
)
def gateway(**options) -> None:
    """Run the OpenAI gateway alone in front of a Triton that serves a packaged repository (the Kubernetes
    sidecar; `lpx serve` starts it itself). Stops on SIGTERM after draining its streams."""
    from ..gateway.process import run

    run(sidecar_settings(**options))


def sidecar_settings(
    triton_url, repo_dir, config_path, variant, model_name, arch, host, port, keys_file, access_log
):
    """The GatewaySettings `lpx gateway` runs with (nothing started): lpx.yaml's serving.openai (or its
    defaults), the repository's tokenizer and model name, and the command line's host / port / keys /
    access log on top (the access log on stdout unless one of them names a file)."""
    from ..config import load_config
    from ..gateway.settings import from_config
    from ..served import packaged_config
    from ..servers.repository import choose_repository

    repo = choose_repository(repo_dir, variant, model_name, arch=arch)
    cfg = load_config(config_path) if config_path is not None else packaged_config(repo, None, True)
    return from_config(
        cfg,
        triton_url,
        repo.path / "preprocessing" / "1" / "tokenizer",
        port,
        model_name=cfg.serving.openai.model_name or repo.manifest["model"],
        host=host,
        api_keys_file=keys_file,
        access_log=access_log
        or (str(cfg.serving.openai.access_log) if cfg.serving.openai.access_log else "-"),
    )
