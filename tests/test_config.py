"""The lpx.yaml schema: defaults, path resolution, and one clear line per problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.config import FORMATS, load_config, parse_config
from pipeline.errors import ConfigError, LpxError

MINIMAL = {"model": {"name": "m", "checkpoint": "ckpt"}, "variants": [{"name": "bf16"}]}


def test_defaults_and_relative_paths(tmp_path):
    p = tmp_path / "lpx.yaml"
    p.write_text(yaml.safe_dump(MINIMAL))
    cfg = load_config(p)
    assert cfg.model.checkpoint == (tmp_path / "ckpt").resolve()
    assert cfg.variants[0].quantization.format == "none"
    assert cfg.serving.host == "127.0.0.1"
    assert cfg.build.target == "torch" and cfg.build.archs == ["sm90"]
    assert cfg.model.allow_pickle is False and cfg.model.trust_remote_code is False


def test_every_error_is_reported_with_its_path():
    bad = {
        "model": {"name": "m", "checkpoint": "c", "colour": "red"},
        "variants": [{"name": "a"}, {"name": "b", "quantization": {"format": "fp9"}}],
        "build": {"archs": ["gpu"]},
        "serving": {"http_port": 70000},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(bad)
    problems = err.value.problems
    assert "model.colour: unknown key (check the spelling; `lpx config schema` lists every key)" in problems
    assert f"variants[1].quantization.format: must be one of {', '.join(FORMATS)}" in problems
    assert any(p.startswith("build.archs: 'gpu' is not a GPU architecture") for p in problems)
    assert any(p.startswith("serving.http_port:") for p in problems)
    assert err.value.exit_code == 2


def test_duplicate_variants_and_lengths():
    data = {
        **MINIMAL,
        "variants": [{"name": "a"}, {"name": "a"}],
        "build": {"max_input_len": 4096, "max_seq_len": 4096},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    text = "\n".join(err.value.problems)
    assert "variant names must be unique; repeated: a" in text
    assert "max_input_len (4096) must be below max_seq_len (4096)" in text


def test_unknown_variant_is_named():
    cfg = parse_config(MINIMAL)
    with pytest.raises(LpxError, match="No variant 'fp8' in the config; known: bf16"):
        cfg.select(["fp8"])


def test_validate_cli_exit_codes(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(MINIMAL))
    bad.write_text(
        yaml.safe_dump({**MINIMAL, "variants": [{"name": "x", "quantization": {"format": "int3"}}]})
    )
    runner = CliRunner()
    ok = runner.invoke(cli, ["config", "validate", "-c", str(good)])
    assert ok.exit_code == 0 and "1 variant(s)" in ok.output
    res = runner.invoke(cli, ["config", "validate", "-c", str(bad)])
    assert res.exit_code != 0 and isinstance(res.exception, ConfigError)
    assert "variants[0].quantization.format: must be one of" in res.exception.message


def test_show_prints_defaults_and_schema_lists_keys(tmp_path):
    p = tmp_path / "lpx.yaml"
    p.write_text(yaml.safe_dump(MINIMAL))
    out = CliRunner().invoke(cli, ["config", "show", "-c", str(p)])
    shown = yaml.safe_load(out.output)
    assert shown["serving"]["max_tokens_cap"] == 1024 and shown["calibration"]["samples"] == 32
    schema = json.loads(CliRunner().invoke(cli, ["config", "schema"]).output)
    assert schema["additionalProperties"] is False
    quant = schema["$defs"]["Quantization"]["properties"]["format"]
    assert quant["enum"] == list(FORMATS)


def test_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "lpx.yaml"
    p.write_text("model: {name: m\nvariants: []\n")
    with pytest.raises(LpxError, match=r"not valid YAML \(line"):
        load_config(p)


EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_validates(path: Path) -> None:
    """Each examples/*.yaml is an lpx.yaml that `lpx config validate` accepts, and its build matrix
    (variant x arch cells, with their capability checks) can be laid out."""
    from pipeline.inspection.matrix import build_matrix

    cfg = load_config(path)
    assert cfg.variants and build_matrix(cfg)


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/*.yaml: at least one example config ships with LPX"
