"""Stages through the one runner, for real: ModelOpt quantization, exports, caching, kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def lpx(*args: str, env_home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "LPX_HOME": str(env_home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _edit(path: Path, fn) -> None:
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.slow
def test_quantize_build_cached_then_changed(demo_config, isolated_home):
    first = lpx("run", "-c", str(demo_config), "--until", "build", env_home=isolated_home)
    assert first.returncode == 0, first.stderr
    assert "quantize  fp8" in first.stderr and "running" in first.stderr

    slot = isolated_home / "artifacts" / "checkpoints" / "tiny-llama" / "fp8" / "any"
    (ckpt_dir,) = [d for d in slot.iterdir() if not d.name.startswith(".")]  # not the slot's .lock file
    manifest = json.loads((ckpt_dir / "manifest.json").read_text())
    assert manifest["complete"] and manifest["key"] == ckpt_dir.name
    assert manifest["versions"]["modelopt"] and manifest["results"]["calibration"]["samples"] == 16
    assert manifest["results"]["calibration"]["source"] == "lpx:calibration.txt"
    # target torch: only the ModelOpt state is written (issue 12)
    assert manifest["results"]["exports"] == ["state"]
    assert (ckpt_dir / "state" / "modelopt_state.pth").is_file()
    assert not (ckpt_dir / "trtllm").exists() and not (ckpt_dir / "hf").exists()

    second = lpx("run", "-c", str(demo_config), "--until", "build", env_home=isolated_home)
    assert second.returncode == 0, second.stderr
    assert f"cached {ckpt_dir.name}" in second.stderr and "running" not in second.stderr

    _edit(demo_config, lambda d: d["calibration"].update(samples=8))
    third = lpx("run", "-c", str(demo_config), "--until", "build", env_home=isolated_home)
    assert third.returncode == 0, third.stderr
    assert "changed: calibration.samples: 16 -> 8" in third.stderr
    assert "changed: checkpoint_key:" in third.stderr  # the build after it re-runs too

    _edit(demo_config, lambda d: d["variants"][0]["quantization"].update(exports=["trtllm", "hf"]))
    fourth = lpx("run", "-c", str(demo_config), "--until", "quantize", env_home=isolated_home)
    assert fourth.returncode == 0, fourth.stderr
    assert "changed: quantization.exports: [] -> " in fourth.stderr and "export.exports:" in fourth.stderr
    (ckpt_dir,) = [d for d in slot.iterdir() if (d / "trtllm").is_dir()]
    trt = json.loads((ckpt_dir / "trtllm" / "config.json").read_text())
    assert trt["quantization"]["quant_algo"] == "FP8" and trt["rotary_base"] == 10000.0
    assert (ckpt_dir / "trtllm" / "rank0.safetensors").is_file()
    assert (ckpt_dir / "hf" / "hf_quant_config.json").is_file() and (
        ckpt_dir / "hf" / "tokenizer.json"
    ).is_file()


@pytest.mark.slow
def test_sigkill_mid_stage_leaves_nothing_complete(demo_config, isolated_home):
    env = {**os.environ, "LPX_HOME": str(isolated_home), "PYTHONPATH": str(ROOT)}
    slot = isolated_home / "artifacts" / "checkpoints" / "tiny-llama" / "fp8" / "any"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "quantize", "-c", str(demo_config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not list(slot.glob(".tmp-*/*")):
        time.sleep(0.05)
    assert list(slot.glob(".tmp-*")), "the stage never started writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    complete = [d for d in slot.iterdir() if not d.name.startswith(".")]
    assert complete == []
    rerun = lpx("quantize", "-c", str(demo_config), env_home=isolated_home)
    assert rerun.returncode == 0, rerun.stderr
    assert "no cached result" in rerun.stderr
    assert not list(slot.glob(".tmp-*")), "the killed run's temporary folder was not swept"
    assert len([d for d in slot.iterdir() if not d.name.startswith(".")]) == 1


def _one_line_error(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("error: "), res.stderr
    for f in fragments:
        assert f in res.stderr


@pytest.mark.slow
def test_bad_inputs_get_one_clear_line(tmp_path, isolated_home):
    cfg = tmp_path / "lpx.yaml"
    base = {
        "model": {"name": "m", "checkpoint": "missing"},
        "variants": [{"name": "fp8", "quantization": {"format": "fp8"}}],
    }
    cfg.write_text(yaml.safe_dump(base))
    _one_line_error(
        lpx("quantize", "-c", str(cfg), env_home=isolated_home), "no checkpoint folder at", "missing"
    )

    (tmp_path / "missing").mkdir()
    _one_line_error(lpx("quantize", "-c", str(cfg), env_home=isolated_home), "has no config.json")

    (tmp_path / "missing" / "config.json").write_text("{}")
    (tmp_path / "missing" / "pytorch_model.bin").write_bytes(b"\x80")
    _one_line_error(
        lpx("quantize", "-c", str(cfg), env_home=isolated_home),
        "only pickle weights",
        "model.allow_pickle: true",
    )

    cfg.write_text(yaml.safe_dump({**base, "variants": [{"name": "x", "quantization": {"format": "int3"}}]}))
    res = lpx("quantize", "-c", str(cfg), env_home=isolated_home)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "variants[0].quantization.format: must be one of none, fp8" in res.stderr

    res = lpx("run", "-c", str(tmp_path / "nope.yaml"), env_home=isolated_home)
    assert res.returncode == 2 and "lpx init DIR" in res.stderr


def test_format_the_archs_cannot_run_is_refused(tmp_path, isolated_home, tiny_checkpoint):
    cfg = tmp_path / "lpx.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "m", "checkpoint": str(tiny_checkpoint)},
                "variants": [{"name": "fp8", "quantization": {"format": "fp8"}}],
                "build": {"archs": ["sm90", "sm80"]},
            }
        )
    )
    res = lpx("quantize", "-c", str(cfg), env_home=isolated_home)
    _one_line_error(res, "format 'fp8' needs sm89 or newer, but build.archs lists sm80")
    assert res.returncode == 2
