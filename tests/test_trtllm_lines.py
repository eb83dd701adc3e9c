"""TensorRT-LLM lines and the targets that build for them (pipeline/facts/trtllm.py, facts/formats.py):
1.3 is built through the LLM API (llmapi) and refused for trtllm-build engines with the fix; a format a
target or line cannot serve is refused before any stage runs, naming what it serves; the llmapi options
written for 1.3 use only the names of the 1.3 contract (tests/contracts/trtllm_llmapi_options_1.3.json);
a variant may build for its own target; `lpx init --checkpoint` writes target llmapi.
All in-process (click's CliRunner); one tiny checkpoint for the module."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers_models import write_tiny_model

from pipeline.cli import cli, main
from pipeline.config import Build, Variant, load_config, parse_config, serving_refusal
from pipeline.facts import formats, trtllm
from pipeline.runner import Runner
from pipeline.stages.build import archs, llmapi

CONTRACTS = Path(__file__).parent / "contracts"
LLMAPI_SERVES = "none, fp8, int4_awq, w4a8_awq, nvfp4"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("ckpt") / "Llama-3.1-8B-Instruct", "llama-3.1-8b")


def _config(folder: Path, checkpoint: Path, build: dict, variants: list | None = None) -> Path:
    path = folder / "lpx.yaml"
    data = {
        "model": {"name": "tiny", "checkpoint": str(checkpoint)},
        "variants": variants or [{"name": "fp8", "quantization": {"format": "fp8"}}],
        "calibration": {"samples": 2, "seq_len": 16},
        "build": build,
    }
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def lpx(monkeypatch, capsys):
    """`lpx ARGS` through the console entry point (its error handling): (exit code, stdout + stderr)."""

    def run(args: list[str]) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["lpx", *args])
        with pytest.raises(SystemExit) as exited:
            main()
        out = capsys.readouterr()
        return exited.value.code, out.out + out.err

    return run


def _refused_before_any_stage(lpx, args: list[str]) -> str:
    """Run `lpx ARGS`: exit 2, a message, no traceback, and $LPX_HOME/artifacts never created."""
    code, out = lpx(args)
    assert code == 2, out
    assert "Traceback" not in out
    assert not (Path(os.environ["LPX_HOME"]) / "artifacts").exists()
    return " ".join(out.split())


def test_13_accepted_for_llmapi_and_the_default_llmapi_line():
    base = {"model": {"name": "m", "checkpoint": "/x"}, "variants": [{"name": "v"}]}
    assert (
        parse_config({**base, "build": {"target": "llmapi", "trtllm_version": "1.3"}}).build.trtllm_version
        == "1.3"
    )
    assert parse_config({**base, "build": {"target": "llmapi"}}).build.trtllm_version == "1.3"
    # engine's unpinned line is the newest that still has trtllm-build
    assert parse_config({**base, "build": {"target": "engine"}}).build.trtllm_version == "1.2"
    assert trtllm.ENGINE_LINES[0] == "1.2" and not trtllm.LINES["1.3"].engine


@pytest.mark.parametrize("command", ["run", "build"])
def test_engine_on_13_refused_with_the_fix(tmp_path, checkpoint, lpx, command):
    cfg = _config(tmp_path, checkpoint, {"target": "engine", "trtllm_version": "1.3"})
    out = _refused_before_any_stage(lpx, [command, "-c", str(cfg)])
    assert "build: build.target engine (trtllm-build) is deprecated in TensorRT-LLM 1.3" in out
    assert "use build.target: llmapi, or pin build.trtllm_version: '1.2'" in out


def test_int8_sq_on_13_llmapi_refused_naming_what_it_serves(tmp_path, checkpoint, lpx):
    variants = [{"name": "sq", "quantization": {"format": "int8_sq"}}]
    cfg = _config(tmp_path, checkpoint, {"target": "llmapi", "trtllm_version": "1.3"}, variants)
    out = _refused_before_any_stage(lpx, ["run", "-c", str(cfg)])
    assert (
        f"variants[0] 'sq': TensorRT-LLM 1.3 (build.target llmapi) cannot serve format 'int8_sq'; it serves {LLMAPI_SERVES}"
        in out
    )


def test_a_variant_override_is_refused_like_the_build_target(tmp_path, checkpoint, lpx):
    variants = [
        {"name": "ref", "quantization": {"format": "int8_sq"}},  # torch serves int8_sq
        {"name": "gpu", "quantization": {"format": "int8_sq"}, "build": {"target": "llmapi"}},
    ]
    cfg = _config(tmp_path, checkpoint, {"target": "torch"}, variants)
    out = _refused_before_any_stage(lpx, ["quantize", "-c", str(cfg)])
    assert (
        f"variants[1] 'gpu': TensorRT-LLM 1.3 (build.target llmapi) cannot serve format 'int8_sq'; it serves {LLMAPI_SERVES}"
        in out
    )


@pytest.mark.parametrize(
    ("engine", "refused", "served"),
    [
        ("vllm", ("int4_awq", "w4a8_awq", "int8_sq"), "none, fp8, nvfp4"),
        ("llmapi", ("int8_sq",), LLMAPI_SERVES),
        ("torch", (), ", ".join(formats.FORMATS)),
    ],
)
def test_per_engine_format_table(engine, refused, served):
    """The table the vllm target imports: each refused format's message names the formats it serves."""
    assert formats.TARGETS == ("engine", "llmapi", "torch", "vllm")
    assert ", ".join(formats.served(engine)) == served
    # a Build carrying a target the config schema may not list yet (vllm): the rule reads the table
    build = Build.model_construct(**{**Build().model_dump(), "target": engine})
    for fmt in formats.FORMATS:
        why = serving_refusal(build, Variant(name="v", quantization={"format": fmt}))
        if fmt in refused:
            assert why and f"cannot serve format '{fmt}'; it serves {served}" in why
        else:
            assert why is None, why


def _paths(obj: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in obj.items():
        out.append(f"{prefix}{k}")
        if isinstance(v, dict):
            out += _paths(v, f"{prefix}{k}.")
    return out


@pytest.mark.parametrize(
    ("fmt", "kv"),
    [(f, kv) for f in formats.served("llmapi") for kv in ("none", "fp8") if f != "none" or kv == "none"],
)
def test_13_contract_names_what_the_llmapi_build_writes(tmp_path, fmt, kv):
    contract = json.loads((CONTRACTS / trtllm.LINES["1.3"].llmapi_contract).read_text())
    assert contract["line"] == "1.3" and contract["source"]["read"]
    cfg = parse_config(
        {
            "model": {"name": "m", "checkpoint": "/x"},
            "variants": [{"name": "v", "quantization": {"format": fmt, "kv_cache": kv}}],
            "build": {"target": "llmapi", "trtllm_version": "1.3"},
        }
    )
    hf = tmp_path / "q" / "hf"
    hf.mkdir(parents=True)
    hf_config = {
        "num_attention_heads": 4,
        "hidden_size": 64,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
    }
    (hf / "config.json").write_text(json.dumps(hf_config))
    res = llmapi.write_llmapi(cfg, cfg.variants[0], tmp_path / "q", tmp_path / "out")
    written = _paths(yaml.safe_load((tmp_path / "out" / "llm_api_options.yaml").read_text()))
    unknown = sorted(set(written) - set(contract["options"]))
    assert not unknown, f"not in the 1.3 contract: {unknown}"
    assert ("kv_cache_config.dtype" in written) == (kv == "fp8")
    assert res["model"]["trtllm_version"] == "1.3"
    flags = [a for a in llmapi.serve_command(tmp_path / "out") if a.startswith("--")]
    assert set(flags) <= set(contract["serve_flags"])


def test_a_variant_builds_for_its_own_target():
    cfg = parse_config(
        {
            "model": {"name": "m", "checkpoint": "/x"},
            "variants": [
                {"name": "ref", "quantization": {"format": "fp8"}},
                {"name": "gpu", "quantization": {"format": "fp8"}, "build": {"target": "llmapi"}},
                {"name": "legacy", "quantization": {"format": "fp8"}, "build": {"target": "engine"}},
            ],
            "build": {"target": "torch", "archs": ["sm90", "sm89"]},
        }
    )
    runner = Runner(cfg)
    seen = {}
    for v in cfg.variants:
        with runner.variant_config(v):
            b = runner.ctx.cfg.build
            seen[v.name] = (b.target, b.trtllm_version, archs(runner.ctx))
    assert seen == {
        "ref": ("torch", "1.3", ["any"]),
        "gpu": ("llmapi", "1.3", ["any"]),
        "legacy": ("engine", "1.2", ["sm90", "sm89"]),  # engine's newest line when the config pins none
    }
    assert runner.ctx.cfg is cfg  # the run's own config is back after each variant


def test_init_with_a_real_checkpoint_writes_target_llmapi(tmp_path, checkpoint):
    res = CliRunner().invoke(cli, ["init", str(tmp_path / "proj"), "--checkpoint", str(checkpoint)])
    assert res.exit_code == 0, res.output
    cfg = load_config(tmp_path / "proj" / "lpx.yaml")
    assert (cfg.build.target, cfg.build.trtllm_version) == ("llmapi", "1.3")
    assert cfg.model.checkpoint == checkpoint.resolve() and cfg.model.name == "llama-3.1-8b-instruct"
    assert [v.quantization.format for v in cfg.variants] == ["fp8"]
    assert not (tmp_path / "proj" / "checkpoint").exists()  # no demo checkpoint beside it


def test_init_refuses_a_folder_that_is_not_a_checkpoint(tmp_path, lpx):
    (tmp_path / "empty").mkdir()
    code, out = lpx(["init", str(tmp_path / "proj"), "--checkpoint", str(tmp_path / "empty")])
    assert code == 2 and "Traceback" not in out, out
    assert "--checkpoint" in out and not (tmp_path / "proj" / "lpx.yaml").exists()
