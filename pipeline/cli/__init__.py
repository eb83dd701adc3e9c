"""`lpx`: the command line, the only part of LPX that imports click. Commands are thin: each parses its
options and calls the layer below; its docstring is its help.

  __init__.py  the `lpx` group (commands loaded on first use, so `lpx --help` starts fast) and `main`,
               which turns every LpxError into its message and exit code - never a traceback
  options.py   the options several commands share
  stages.py    run, quantize, eval, build, repo, serve, generate
  state.py     init, config, artifacts (list, path, gc), path
  tools.py     bench, compare, doctor, matrix, plan
  deploy.py    deploy k8s, deploy dynamo
  api_keys.py  keys (the OpenAI gateway's API keys)
  gateway.py   gateway (the gateway alone in front of a Triton, e.g. the Kubernetes sidecar)
  monitor.py   top, monitoring
  tune.py      tune
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from .. import __version__
from ..errors import LpxError

# command -> "module:attribute" under pipeline.cli, imported when the command is used or listed
COMMANDS = {
    "init": "state:init",
    "run": "stages:run",
    "quantize": "stages:quantize",
    "eval": "stages:eval_",
    "build": "stages:build",
    "repo": "stages:repo",
    "serve": "stages:serve",
    "generate": "stages:generate",
    "config": "state:config",
    "artifacts": "state:artifacts",
    "path": "state:path",
    "bench": "tools:bench",
    "compare": "tools:compare",
    "doctor": "tools:doctor",
    "matrix": "tools:matrix",
    "plan": "tools:plan",
    "deploy": "deploy:deploy",
    "keys": "api_keys:keys",
    "gateway": "gateway:gateway",
    "top": "monitor:top",
    "monitoring": "monitor:monitoring",
    "tune": "tune:tune",
}


class LazyGroup(click.Group):
    """A group whose commands live in other modules, imported only when needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lpx")
def cli() -> None:
    """LPX: quantize, build, serve and measure small LLMs with ModelOpt, TensorRT-LLM and Triton."""


def main() -> None:
    os.environ.setdefault(
        "TRANSFORMERS_VERBOSITY", "error"
    )  # the runner silences the rest when it loads them
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    debug = bool(os.environ.get("LPX_DEBUG"))
    try:
        cli.main(standalone_mode=False)
    except LpxError as exc:
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
        full = None if debug else _disk_full(exc)
        if full is not None:
            click.secho(f"error: {full.message}", err=True, fg="red")
            sys.exit(full.exit_code)
        if debug:
            raise
        click.secho(f"error: unexpected {type(exc).__name__}: {exc}", err=True, fg="red")
        click.echo(
            "This is a bug or an unsupported setup; re-run with LPX_DEBUG=1 for the traceback.", err=True
        )
        sys.exit(1)


def _disk_full(exc: BaseException):
    """A full disk that no stage caught (the demo checkpoint, bench results, ...) as a DiskFull naming the
    folder written (from the error, else LPX_HOME) and its free space; None for any other error."""
    from pathlib import Path

    from ..artifacts import home
    from ..errors import disk_full, disk_full_cause

    cause = disk_full_cause(exc)
    if cause is None:
        return None
    name = getattr(cause, "filename", None)
    folder = Path(os.fsdecode(name)).parent if isinstance(name, (str, bytes, os.PathLike)) else home()
    while not folder.exists() and folder != folder.parent:  # a staging folder its writer removed
        folder = folder.parent
    return disk_full(folder, cause, kept=False)
