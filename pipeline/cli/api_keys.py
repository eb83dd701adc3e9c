"""`lpx keys add / list / revoke`: the OpenAI gateway's API keys (pipeline/gateway/api_keys.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from .options import config_path_option

file_option = click.option(
    "--file",
    "keys_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The keys file (default: serving.openai.api_keys_file of -c / $LPX_CONFIG / ./lpx.yaml, "
    "else $LPX_HOME/gateway/keys.json).",
)
config_file_option = config_path_option("lpx.yaml to read.")


def keys_path(keys_file: Path | None, config_path: Path | None) -> Path:
    from ..gateway.api_keys import default_path

    if keys_file is not None:
        return keys_file
    if config_path is None and os.environ.get("LPX_CONFIG"):
        config_path = Path(os.environ["LPX_CONFIG"])
    if config_path is None and Path("lpx.yaml").is_file():
        config_path = Path("lpx.yaml")
    if config_path is not None:
        from ..config import load_config

        configured = load_config(config_path).serving.openai.api_keys_file
        if configured is not None:
            return configured
    return default_path()


@click.group("keys")
def keys() -> None:
    """API keys of the OpenAI gateway: stored as SHA-256 hashes; once one exists, every request needs one."""


@keys.command("add")
@click.option("--name", default="", help="A label to recognise the key by (who or what uses it).")
@click.option("--rpm", type=click.IntRange(1), default=None, help="Requests per minute for this key.")
@click.option("--tpm", type=click.IntRange(1), default=None, help="Prompt + completion tokens per minute.")
@file_option
@config_file_option
def add(
    name: str, rpm: int | None, tpm: int | None, keys_file: Path | None, config_path: Path | None
) -> None:
    """Create a key and print its secret - once: only its hash is stored."""
    from ..gateway.api_keys import add_key

    path = keys_path(keys_file, config_path)
    key, secret = add_key(path, name, rpm, tpm)
    click.echo(secret)
    click.echo(
        f"added {key.id} to {path} - this is the only time the secret is shown; "
        "send it as 'Authorization: Bearer <secret>'",
        err=True,
    )


@keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@file_option
@config_file_option
def list_(as_json: bool, keys_file: Path | None, config_path: Path | None) -> None:
    """List the keys (ids, names, limits; never secrets)."""
    from ..gateway.api_keys import read_keys

    path = keys_path(keys_file, config_path)
    found = [k.public() for k in read_keys(path)]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo(f"no keys in {path}: the gateway answers anyone who can reach it")
        return
    for k in found:
        limits = ", ".join(
            f"{v} {label}/min"
            for label, v in (("requests", k["requests_per_minute"]), ("tokens", k["tokens_per_minute"]))
            if v
        )
        click.echo(f"{k['id']}  {k['created']}  {k['name'] or '-'}" + (f"  ({limits})" if limits else ""))


@keys.command("revoke")
@click.argument("key_id")
@file_option
@config_file_option
def revoke(key_id: str, keys_file: Path | None, config_path: Path | None) -> None:
    """Remove a key: requests with it are refused from then on (the gateway re-reads the file)."""
    from ..gateway.api_keys import revoke_key

    path = keys_path(keys_file, config_path)
    key = revoke_key(path, key_id)
    click.echo(f"revoked {key.id} ({key.name or 'no name'}) in {path}")
