"""CLI plumbing: init, paths, artifacts listing."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.config import load_config


@pytest.mark.slow
def test_init_writes_a_working_config(tmp_path, isolated_home):
    runner = CliRunner()
    res = runner.invoke(cli, ["init", str(tmp_path / "proj")])
    assert res.exit_code == 0, res.output
    cfg = load_config(tmp_path / "proj" / "lpx.yaml")
    assert cfg.model.checkpoint == (tmp_path / "proj" / "checkpoint").resolve()
    assert (cfg.model.checkpoint / "config.json").is_file() and (
        cfg.model.checkpoint / "tokenizer.json"
    ).is_file()
    hf = yaml.safe_load((cfg.model.checkpoint / "config.json").read_text())
    assert hf["num_key_value_heads"] < hf["num_attention_heads"]  # grouped-query attention
    again = runner.invoke(cli, ["init", str(tmp_path / "proj")])
    assert again.exit_code != 0 and "already exists" in str(again.exception)


def test_paths_follow_lpx_home(isolated_home):
    runner = CliRunner()
    assert runner.invoke(cli, ["path"]).output.strip() == str(isolated_home)
    assert runner.invoke(cli, ["artifacts", "path"]).output.strip() == str(isolated_home / "artifacts")
    assert "no artifacts yet" in runner.invoke(cli, ["artifacts", "list"]).output


def test_demo_tokenizer_round_trips_chinese_and_emoji(tiny_checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    text = "你好, world 👋 Hello, 世界 🌍 ünïcödé"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text


def test_serving_problems_are_found_before_any_stage_runs(tmp_path, isolated_home, monkeypatch):
    """A busy port and a missing tritonserver: one clear line, exit 1, nothing quantized."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from pipeline.errors import LpxError
    from pipeline.servers import binary

    cfg = tmp_path / "lpx.yaml"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg.write_text(
            yaml.safe_dump(
                {
                    "model": {"name": "m", "checkpoint": "nowhere"},
                    "variants": [{"name": "a"}],
                    "serving": {"grpc_port": port, "http_port": 0, "metrics_port": 0},
                }
            )
        )
        root = Path(__file__).resolve().parents[1]
        res = subprocess.run(
            [sys.executable, "-m", "pipeline", "run", "-c", str(cfg)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
            timeout=120,
        )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith(f"error: Port {port} on 127.0.0.1 is already in use")
    assert "serving.grpc_port" in res.stderr
    assert not (isolated_home / "artifacts").exists()

    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "m", "checkpoint": "nowhere"},
                "variants": [{"name": "a"}],
                "serving": {"grpc_port": 0, "http_port": 0, "metrics_port": 0},
            }
        )
    )
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(binary, "bundled_root", lambda: None)
    monkeypatch.setattr(binary, "CONTAINER_BIN", tmp_path / "no-tritonserver")
    result = CliRunner().invoke(cli, ["serve", "-c", str(cfg)])
    assert isinstance(result.exception, LpxError)
    assert "lpx[triton]" in result.exception.message
    with pytest.raises(LpxError):
        binary.find_tritonserver()
