"""Commands about LPX's state: `lpx init`, `lpx config`, `lpx artifacts` and `lpx path`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .options import config_option, config_path_option


@click.command()
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--tune", "with_tune", is_flag=True, help="Add a second variant (bf16) and a small `lpx tune` search."
)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="A local Hugging Face checkpoint: write an lpx.yaml for it (FP8, build.target llmapi: "
    "TensorRT-LLM's LLM API) instead of the demo.",
)
@click.option(
    "--example",
    metavar="NAME",
    default=None,
    help="A real model found in LPX's environment (smollm2: SmolLM2-135M-Instruct, installed by "
    "`make real-model`): its GGUF converted once into DIRECTORY, and an lpx.yaml that runs here "
    "(bf16, fp8, int4_awq on the torch target). docs/real-model.md.",
)
@click.option(
    "--gguf",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A local GGUF file: converted once into a Hugging Face checkpoint in DIRECTORY, with an lpx.yaml "
    "like --example's.",
)
def init(
    directory: Path, with_tune: bool, checkpoint: Path | None, example: str | None, gguf: Path | None
) -> None:
    """Write the demo's lpx.yaml and its tiny checkpoint into DIRECTORY (or, with --checkpoint, an
    lpx.yaml for a real checkpoint, built for a GPU with TensorRT-LLM's LLM API; with --example or
    --gguf, a real model converted from GGUF and an lpx.yaml that runs on this machine)."""
    from ..errors import UsageError

    chosen = [f for f, v in (("--checkpoint", checkpoint), ("--example", example), ("--gguf", gguf)) if v]
    if len(chosen) > 1 or (chosen and with_tune):
        raise UsageError(
            f"init: {' and '.join(chosen + ['--tune'] * with_tune)} exclude each other - pass one"
        )
    if (directory / "lpx.yaml").exists():
        raise UsageError(f"{directory / 'lpx.yaml'} already exists - choose an empty folder")
    if checkpoint is not None:
        path = write_checkpoint_config(directory, checkpoint)
        click.echo(f"wrote {path}\nnext: lpx plan -c {path} --gpu h100-sxm, then lpx run -c {path}")
        return
    if example is not None or gguf is not None:
        path = write_gguf_config(directory, example, gguf)
        click.echo(f"wrote {path}\nnext: lpx run -c {path}")
        return
    from ..demo import ensure_checkpoint, write_demo_config

    ensure_checkpoint(directory / "checkpoint")
    path = write_demo_config(directory, tune=with_tune)
    then = f"lpx tune -c {path}" if with_tune else f"lpx run -c {path}"
    click.echo(f"wrote {path} and {directory / 'checkpoint'}\nnext: {then}")


def write_gguf_config(directory: Path, example: str | None, gguf: Path | None) -> Path:
    """--example NAME or --gguf FILE: the GGUF checked (before anything is written), converted once into
    DIRECTORY/<model name>/ (reused while its sha256 record matches) and DIRECTORY/lpx.yaml written."""
    from ..config import parse_config
    from ..examples import (
        DEFAULT_QUESTION,
        convert_gguf,
        example_config,
        example_gguf,
        has_chat_template,
        model_name,
    )
    from ..examples import write_config as write_example_config

    if example is not None:
        spec, gguf = example_gguf(example)
        name, question, source = spec.name, spec.question, f"{gguf.name} ({spec.distribution})"
    else:
        name, question, source = model_name(gguf), None, str(gguf.expanduser().resolve())
    ckpt = convert_gguf(gguf, directory / name, say=click.echo)  # the header is checked before converting
    if question is None and has_chat_template(ckpt):
        question = DEFAULT_QUESTION
    data = example_config(name, name, question)
    parse_config(data, "the written lpx.yaml", base=directory)  # what is written validates
    return write_example_config(directory, data, source)


def checkpoint_config(checkpoint: Path, name: str) -> dict:
    """The lpx.yaml of a real checkpoint: one FP8 variant (FP8 KV cache), built for TensorRT-LLM's LLM
    API (build.target llmapi, the newest line it builds for) on Hopper."""
    from ..facts import trtllm

    return {
        "model": {"name": name, "checkpoint": str(checkpoint)},
        "variants": [{"name": "fp8", "quantization": {"format": "fp8", "kv_cache": "fp8"}}],
        "build": {"target": "llmapi", "trtllm_version": trtllm.default_line("llmapi"), "archs": ["sm90"]},
    }


def write_checkpoint_config(directory: Path, checkpoint: Path) -> Path:
    """Check `checkpoint` (config.json, safetensors, tokenizer) and write DIRECTORY/lpx.yaml for it."""
    import re

    import yaml

    from ..config import NAME_RE, parse_config
    from ..errors import LpxError, UsageError
    from ..inspection.checkpoint import inspect_checkpoint

    checkpoint = checkpoint.expanduser().resolve()
    try:
        inspect_checkpoint(checkpoint, key="--checkpoint")
    except LpxError as exc:  # a bad argument: exit 2, like a bad config
        raise UsageError(exc.message) from None
    name = re.sub(r"[^A-Za-z0-9._-]", "-", checkpoint.name).lstrip("._-").lower() or "model"
    data = checkpoint_config(checkpoint, name if re.match(NAME_RE, name) else "model")
    parse_config(data, "--checkpoint")  # what is written validates
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "lpx.yaml"
    header = (
        f"# LPX config for {checkpoint.name}: FP8 weights and KV cache, built for TensorRT-LLM's LLM API\n"
        "# (build.target llmapi). Set build.archs / build.gpu to your GPUs; lpx config schema lists every key.\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@click.group()
def config() -> None:
    """Validate, show and describe lpx.yaml."""


@config.command()
@config_option
def validate(config_path) -> None:
    """Check a config; print every problem as `path: message` and exit 2 if any."""
    from ..config import load_config

    cfg = load_config(config_path or Path("lpx.yaml"))
    click.echo(f"ok: model {cfg.model.name}, {len(cfg.variants)} variant(s), target {cfg.build.target}")


@config.command()
@config_option
def show(config_path) -> None:
    """Print the resolved config, defaults filled in."""
    from ..config import dump_config, resolve_config
    from ..progress import Reporter

    click.echo(dump_config(resolve_config(config_path, Reporter())), nl=False)


@config.command()
def schema() -> None:
    """Print the JSON schema of lpx.yaml (for editors)."""
    from ..config import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@click.group()
def artifacts() -> None:
    """List, locate and clean up stage outputs (under $LPX_HOME/artifacts)."""


@artifacts.command(name="list")
@click.option("--json", "as_json", is_flag=True)
def artifacts_list(as_json) -> None:
    """Every complete artifact: stage, model, variant, arch, key, age, path."""
    from ..artifacts import Store

    arts = Store().all()
    if as_json:
        keys = ("stage", "model", "variant", "arch", "key", "created")
        click.echo(
            json.dumps([{k: a.manifest[k] for k in keys} | {"path": str(a.path)} for a in arts], indent=2)
        )
        return
    if not arts:
        click.echo("no artifacts yet - run 'lpx run'")
    for a in arts:
        m = a.manifest
        click.echo(f"{m['stage']:<9} {m['model']}/{m['variant']}/{m['arch']}  {m['key']}  {a.path}")


@artifacts.command(name="path")
@click.option("--stage", type=click.Choice(["quantize", "eval", "build", "repo"]), default=None)
@click.option("--model", default=None)
@click.option("--variant", default=None)
@click.option("--arch", default=None)
def artifacts_path(stage, model, variant, arch) -> None:
    """Print the artifact root, or the newest artifact matching the filters."""
    from ..artifacts import Store
    from ..errors import NotFound

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
        raise NotFound("No artifact matches - 'lpx artifacts list' shows what exists")
    click.echo(max(arts, key=lambda a: a.manifest.get("created", 0)).path)


@artifacts.command(name="gc")
@config_path_option(
    "An lpx.yaml whose artifacts to keep (repeatable: pass every config that shares LPX_HOME).",
    multiple=True,
    required=True,
)
@click.option("--yes", is_flag=True, help="Delete; without it nothing is removed (a dry run).")
def artifacts_gc(config_paths, yes) -> None:
    """Remove the artifacts of these configs' models that no config references any more (dry run by
    default: lists each with its size), and staging folders left by killed runs."""
    from ..gc import collect, remove

    plan = collect(list(config_paths))
    for line in plan.lines():
        click.echo(line)
    if not plan.candidates:
        return
    if not yes:
        click.echo("dry run: nothing removed - pass --yes to delete these")
        return
    freed = remove(plan)
    click.echo(f"removed {len(plan.candidates)} folder(s), {freed / 2**30:.2f} GiB")


@click.command()
def path() -> None:
    """Print LPX_HOME, where all LPX state lives."""
    from ..artifacts import home

    click.echo(home())
