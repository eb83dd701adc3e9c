"""Each stage's key holds what shapes its output and nothing else (issue 13): a rule that changes the
composed trtllm-build argv, a config.pbtxt, the LLM-API options or lpx_engine.json re-runs that stage
and the runner names the change; an edit to a stage's code does too; build.timeout_s re-runs nothing."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from pipeline.cache_keys import code_fingerprint, explain, make_key
from pipeline.config import parse_config
from pipeline.progress import Reporter
from pipeline.runner import Runner
from pipeline.stages.build import llmapi, torch_target, trtllm_build
from pipeline.stages.repository import model_configs

ROOT = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).parent / "standin_trtllm_build.py"
STAGE_NAMES = ("quantize", "eval", "build", "repo")


def config(ckpt: Path, target: str, **build):
    return parse_config(
        {
            "model": {"name": "tiny", "checkpoint": str(ckpt)},
            "variants": [{"name": "fp8", "quantization": {"format": "fp8"}}],
            "calibration": {"samples": 4, "seq_len": 32, "batch_size": 2},
            "evaluation": {"samples": 2, "seq_len": 32},
            "build": {
                "target": target,
                "archs": ["sm90"],
                "max_batch_size": 8,
                "max_input_len": 256,
                "max_seq_len": 512,
                "max_num_tokens": 1024,
                **build,
            },
        }
    )


def run(cfg) -> dict[str, str]:
    """Run the stages up to repo; each stage's report line ('cached KEY' or 'running KEY (why)')."""
    out = io.StringIO()
    Runner(cfg, Reporter(Console(file=out, width=1000))).run(cfg.variants, "repo")
    lines = {}
    for line in out.getvalue().splitlines():
        stage = line.split(" ", 1)[0]
        if stage in STAGE_NAMES and ("cached" in line or "running" in line):
            lines[stage] = line
    return lines


def assert_cached(lines: dict[str, str], *stages: str) -> None:
    for stage in stages:
        assert " cached " in lines[stage], lines[stage]


def built_then_cached(ckpt: Path, target: str) -> None:
    """Run every stage once; then a changed build.timeout_s re-runs nothing."""
    first = run(config(ckpt, target))
    assert all("running" in first[s] for s in STAGE_NAMES)
    assert_cached(run(config(ckpt, target)), *STAGE_NAMES)
    assert_cached(run(config(ckpt, target, timeout_s=7)), *STAGE_NAMES)


def after_rule_change(monkeypatch, module, rule: str, value, cfg, *cached: str) -> dict[str, str]:
    """Change one of LPX's rules (a module constant: not the config, not the code), run again, check
    what stayed cached, and return the report lines."""
    monkeypatch.setattr(module, rule, value)
    lines = run(cfg)
    assert_cached(lines, *cached)
    return lines


# -- keys.explain and the code fingerprint, on their own ---------------------------------------------
def test_explain_names_each_kind_of_change():
    old = {
        "checkpoint_key": "a",
        "trtllm-build argv": ["trtllm-build", "--max_batch_size", "8", "--gemm_plugin", "auto"],
        "config.pbtxt": {"ensemble": "name: x\nmax_batch_size: 8\n", "bls": "same\n"},
        "code": {"pipeline.x": "1", "pipeline.y": "2"},
        "build": {"max_seq_len": 512},
    }
    new = {
        "checkpoint_key": "a",
        "trtllm-build argv": [
            "trtllm-build",
            "--max_batch_size",
            "16",
            "--gemm_plugin",
            "auto",
            "--workers",
            "2",
        ],
        "config.pbtxt": {"ensemble": "name: x\nmax_batch_size: 16\n", "bls": "same\n"},
        "code": {"pipeline.x": "1", "pipeline.y": "3"},
        "build": {"max_seq_len": 1024},
    }
    assert explain(old, new) == [
        "trtllm-build argv changed: --max_batch_size 8 -> 16",
        "trtllm-build argv changed: --workers <unset> -> 2",
        "config.pbtxt of ensemble changed: max_batch_size: 8 -> max_batch_size: 16",
        "code of pipeline.y changed",
        "build.max_seq_len: 512 -> 1024",
    ]
    assert explain(new, new) == [] and make_key(old) != make_key(new)


def test_code_fingerprint_follows_the_source(tmp_path, monkeypatch):
    module = tmp_path / "lpx_probe_rule.py"
    module.write_text("LIMIT = 8\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_fingerprint(["lpx_probe_rule"])
    module.write_text("LIMIT = 16\n")
    assert code_fingerprint(["lpx_probe_rule"]) != before
    assert explain({"code": before}, {"code": code_fingerprint(["lpx_probe_rule"])}) == [
        "code of lpx_probe_rule changed"
    ]
    with pytest.raises(RuntimeError, match="does not exist"):
        code_fingerprint(["lpx_no_such_module"])


# -- each stage, through the runner ----------------------------------------------------------------
@pytest.mark.slow
def test_engine_build_reruns_when_the_argv_changes(tiny_checkpoint, isolated_home, monkeypatch):
    monkeypatch.setenv("LPX_TRTLLM_BUILD", f"{sys.executable} {STANDIN}")
    monkeypatch.delenv("STANDIN_FAIL", raising=False)
    built_then_cached(tiny_checkpoint, "engine")
    cfg = config(tiny_checkpoint, "engine")
    lines = after_rule_change(monkeypatch, trtllm_build, "SMALL_BATCH_FP8_GEMM", 8, cfg, "quantize", "eval")
    assert "trtllm-build argv changed: --gemm_plugin auto -> fp8" in lines["build"]
    assert "code of" not in lines["build"]
    assert "changed: engine_key:" in lines["repo"]

    monkeypatch.setattr(
        trtllm_build, "SMALL_BATCH_FP8_GEMM", 4
    )  # LPX's rule again (no undo(): it would drop LPX_HOME)
    lines = run(config(tiny_checkpoint, "engine", max_batch_size=16))
    assert_cached(lines, "quantize", "eval")
    assert "trtllm-build argv changed: --max_batch_size 8 -> 16" in lines["build"]
    assert "config.pbtxt of ensemble changed: max_batch_size: 8 -> max_batch_size: 16" in lines["repo"]


@pytest.mark.slow
def test_torch_build_and_repo_rerun_when_what_they_write_changes(tiny_checkpoint, isolated_home, monkeypatch):
    built_then_cached(tiny_checkpoint, "torch")
    cfg = config(tiny_checkpoint, "torch")
    lines = after_rule_change(monkeypatch, torch_target, "TOKENS_PER_BLOCK", 64, cfg, "quantize", "eval")
    assert "lpx_engine.json.tokens_per_block: 32 -> 64" in lines["build"]
    lines = after_rule_change(
        monkeypatch, model_configs, "BLS_INSTANCE_COUNT", 2, cfg, "quantize", "eval", "build"
    )
    assert "config.pbtxt of tensorrt_llm_bls changed: count: 1 -> count: 2" in lines["repo"]

    cfg = config(tiny_checkpoint, "torch")
    cfg.serving.max_tokens_cap = 64  # reaches the repository only through the config.pbtxt it shapes
    lines = run(cfg)
    assert_cached(lines, "quantize", "eval", "build")
    assert (
        'config.pbtxt of preprocessing changed: string_value: "1024" -> string_value: "64"' in lines["repo"]
    )


@pytest.mark.slow
def test_llmapi_build_reruns_when_its_options_change(tiny_checkpoint, isolated_home, monkeypatch):
    built_then_cached(tiny_checkpoint, "llmapi")
    cfg = config(tiny_checkpoint, "llmapi")
    lines = after_rule_change(
        monkeypatch, llmapi, "KV_FREE_GPU_MEMORY_FRACTION", 0.8, cfg, "quantize", "eval"
    )
    assert "llm_api_options.kv_cache_config.free_gpu_memory_fraction: 0.9 -> 0.8" in lines["build"]
    assert "changed: engine_key:" in lines["repo"]


@pytest.mark.slow
def test_an_edit_to_a_stage_module_reruns_that_stage(tmp_path, tiny_checkpoint):
    """A real edit to a copy of LPX: the build names the module whose code changed; quantize stays cached."""
    copy = tmp_path / "lpx"
    for part in ("pipeline", "model_repo"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = tmp_path / "lpx.yaml"
    data = config(tiny_checkpoint, "torch").model_dump(mode="json")
    cfg.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": str(copy), "LPX_HOME": str(tmp_path / "home")}

    def python(*args: str) -> subprocess.CompletedProcess:
        # cwd: `python -m` puts the working directory first on sys.path, before PYTHONPATH
        res = subprocess.run(
            [sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 0, res.stderr
        return res

    def lpx(*args: str) -> str:
        return python("-m", "pipeline", *args).stderr

    assert python("-c", "import pipeline; print(pipeline.__file__)").stdout.startswith(str(copy))
    first = lpx("build", "-c", str(cfg))
    assert "running" in first
    module = copy / "pipeline" / "stages" / "build" / "torch_target.py"
    module.write_text(module.read_text() + "\n# a change to the rules that write lpx_engine.json\n")
    second = lpx("build", "-c", str(cfg))
    build = next(line for line in second.splitlines() if line.startswith("build"))
    assert "running" in build and "code of pipeline.stages.build.torch_target changed" in build
    assert "cached" in next(line for line in second.splitlines() if line.startswith("quantize"))
