"""The `engine` target end to end through the runner, with the trtllm-build stand-in
(tests/standin_trtllm_build.py checks every flag against tests/contracts/trtllm_build_flags.json)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.config import parse_config
from pipeline.errors import LpxError
from pipeline.progress import Reporter
from pipeline.runner import Runner

STANDIN = Path(__file__).parent / "standin_trtllm_build.py"


def _cfg(ckpt, version="1.2"):
    return parse_config(
        {
            "model": {"name": "tiny", "checkpoint": str(ckpt)},
            "variants": [{"name": "fp8", "quantization": {"format": "fp8", "kv_cache": "fp8"}}],
            "calibration": {"samples": 8, "seq_len": 64, "batch_size": 4},
            "evaluation": {"samples": 2, "seq_len": 32},
            "build": {
                "target": "engine",
                "trtllm_version": version,
                "archs": ["sm90", "sm89"],
                "max_batch_size": 8,
                "max_input_len": 512,
                "max_seq_len": 1024,
                "max_num_tokens": 4096,
            },
        }
    )


def _runner(cfg, **kw):
    out = io.StringIO()
    return Runner(cfg, Reporter(Console(file=out, width=400)), **kw), out


@pytest.mark.slow
def test_engine_per_arch_cached_and_rebuilt_on_version_change(tiny_checkpoint, isolated_home, monkeypatch):
    monkeypatch.setenv("LPX_TRTLLM_BUILD", f"{sys.executable} {STANDIN}")
    monkeypatch.delenv("STANDIN_FAIL", raising=False)
    cfg = _cfg(tiny_checkpoint)
    runner, _ = _runner(cfg)
    outcome = runner.run(cfg.variants, "build")[0]
    sm90, sm89 = outcome.artifacts["build:sm90"], outcome.artifacts["build:sm89"]
    assert sm90.key != sm89.key, "an engine for sm90 must never satisfy sm89"
    assert sm90.path.parent == isolated_home / "artifacts" / "engines" / "tiny" / "fp8" / "sm90"
    engine = json.loads((sm90.path / "config.json").read_text())
    assert engine["build_config"]["max_batch_size"] == 8 and (sm90.path / "rank0.engine").is_file()
    results = sm90.manifest["results"]
    assert "--kv_cache_type" in results["command"] and results["build_s"] >= 0
    assert set(results["environment"]) >= {"gpu", "sm", "driver", "cuda", "tensorrt", "tensorrt_llm"}
    assert "build.log" in {p.name for p in sm90.path.iterdir()}

    again, log = _runner(cfg)
    again.run(cfg.variants, "build")
    assert f"cached {sm90.key}" in log.getvalue() and f"cached {sm89.key}" in log.getvalue()

    old, log = _runner(_cfg(tiny_checkpoint, "0.16"))
    rebuilt = old.run(old.cfg.variants, "build")[0].artifacts["build:sm90"]
    assert rebuilt.key != sm90.key and "changed: target.trtllm_version: 1.2 -> 0.16" in log.getvalue()
    assert "trtllm-build argv changed: --paged_kv_cache <unset> -> enable" in log.getvalue()
    assert "--paged_kv_cache" in rebuilt.manifest["results"]["command"]


@pytest.mark.slow
def test_failed_build_leaves_no_engine_and_keeps_the_log(tiny_checkpoint, isolated_home, monkeypatch):
    monkeypatch.setenv("LPX_TRTLLM_BUILD", f"{sys.executable} {STANDIN}")
    monkeypatch.setenv("STANDIN_FAIL", "1")
    cfg = _cfg(tiny_checkpoint)
    runner, _ = _runner(cfg)
    with pytest.raises(LpxError) as err:
        runner.run(cfg.variants, "build")
    kept = isolated_home / "logs" / "build-tiny-fp8-sm90.log"
    assert str(kept) in err.value.message and "out of memory" in err.value.detail
    assert "stand-in failure" in kept.read_text()
    slot = isolated_home / "artifacts" / "engines" / "tiny" / "fp8" / "sm90"
    assert [p for p in slot.iterdir() if not p.name.startswith(".")] == []


@pytest.mark.slow
def test_dry_run_prints_command_and_reasons(tiny_checkpoint, isolated_home):
    runner, log = _runner(_cfg(tiny_checkpoint), dry_run=True)
    outcome = runner.run(runner.cfg.variants, "build")[0]
    text = log.getvalue()
    assert "dry run (nothing is built)" in text and "trtllm-build --checkpoint_dir" in text
    assert "--use_paged_context_fmha" in text and "needed for chunked context and KV-cache reuse" in text
    assert not any(k.startswith("build:") for k in outcome.artifacts)
    assert not (isolated_home / "artifacts" / "engines").exists()
