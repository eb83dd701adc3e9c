"""CLI plumbing: init, paths, artifacts listing."""

from __future__ import annotations

import yaml
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.config import load_config


def test_init_writes_a_working_config(tmp_path, isolated_home):
    runner = CliRunner()
    res = runner.invoke(cli, ["init", str(tmp_path / "proj")])
    assert res.exit_code == 0, res.output
    cfg = load_config(tmp_path / "proj" / "lpx.yaml")
    assert cfg.model.checkpoint == (tmp_path / "proj" / "checkpoint").resolve()
    assert (cfg.model.checkpoint / "config.json").is_file() and (cfg.model.checkpoint / "tokenizer.json").is_file()
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
