"""Options several commands share."""

from __future__ import annotations

from pathlib import Path

import click

CONFIG_HELP = "lpx.yaml to use (default: $LPX_CONFIG, ./lpx.yaml, else the built-in demo)."


def config_path_option(help: str = CONFIG_HELP, multiple: bool = False, required: bool = False):
    """-c / --config, declared once for every command: an lpx.yaml path passed as `config_path` (None when
    not given; how a command resolves that is its own, said in `help`), or as `config_paths` (a tuple) when
    repeatable."""
    return click.option(
        "-c",
        "--config",
        "config_paths" if multiple else "config_path",
        type=click.Path(path_type=Path),
        default=None,
        multiple=multiple,
        required=required,
        help=help,
    )


config_option = config_path_option()  # the commands that resolve it as `lpx run` does
variant_option = click.option(
    "--variant", "variants", multiple=True, help="Only these variants (repeatable)."
)
force_option = click.option("--force", is_flag=True, help="Re-run the stage even if a cached result matches.")
skip_gate_option = click.option(
    "--skip-gate", is_flag=True, help="Build variants that fail quality_gate (with a warning)."
)
dataset_option = click.option(
    "--dataset",
    type=click.Path(path_type=Path),
    default=None,
    help="Prompts from a local .txt (one per paragraph) or .jsonl file.",
)
dataset_field_option = click.option(
    "--dataset-field", default="prompt", show_default=True, help="The .jsonl field holding the prompt."
)


def _slo_checker(required: bool):
    """A click callback refusing an --slo value the SLO grammar (pipeline/slo.py) refuses, as lpx.yaml's
    tune.slo does: the same strings pass or fail on the command line and in the config."""

    def check(_ctx: click.Context, _param: click.Parameter, value):
        from ..slo import message, slo_problem

        for text in value if isinstance(value, tuple) else (value,):
            if text is not None and (why := slo_problem(text, required)):
                raise click.BadParameter(message(text, why))
        return value

    return check


def slo_option(help: str, multiple: bool = False, required: bool = False):
    """--slo checked by the one SLO grammar. `required`: blank text is refused (tune), else it is no SLO."""
    return click.option(
        "--slo",
        "slos" if multiple else "slo",
        multiple=multiple,
        default=None,
        callback=_slo_checker(required),
        help=help,
    )
