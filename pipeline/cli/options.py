"""Options several commands share."""

from __future__ import annotations

from pathlib import Path

import click

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
dataset_option = click.option(
    "--dataset",
    type=click.Path(path_type=Path),
    default=None,
    help="Prompts from a local .txt (one per paragraph) or .jsonl file.",
)
dataset_field_option = click.option(
    "--dataset-field", default="prompt", show_default=True, help="The .jsonl field holding the prompt."
)
