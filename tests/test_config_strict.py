"""Broken lpx.yaml files, each refused through the CLI before any stage runs: exit code 2, one message naming
the field (or the file and line) and the fix, never a traceback or "unexpected", nothing under
$LPX_HOME/artifacts. The broken files are variations of the configs users run: examples/lpx.yaml
(Llama-3.1-8B-Instruct), the demo's, and Qwen2.5 / Mistral configs as `lpx init` users write them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.demo import demo_config_dict

ROOT = Path(__file__).resolve().parents[1]
LLAMA = (ROOT / "examples" / "lpx.yaml").read_text(encoding="utf-8")
LLAMA_BUILD_LINE = LLAMA.splitlines().index("build:") + 1
DEMO = yaml.safe_dump(demo_config_dict(), sort_keys=False)
QWEN = """\
model:
  name: qwen2.5-7b-instruct
  checkpoint: /models/Qwen2.5-7B-Instruct
variants:
  - name: int4_awq
    quantization: {format: int4_awq, awq_block_size: 128}
  - name: fp8
    quantization: {format: fp8, kv_cache: fp8}
build:
  target: engine
  archs: [sm90]
  max_batch_size: 128
  max_input_len: 16384
  max_seq_len: 32768
  max_num_tokens: 16384
serving:
  max_tokens_cap: 4096
"""
MISTRAL = """\
model:
  name: mistral-7b-instruct-v0.3
  checkpoint: /models/Mistral-7B-Instruct-v0.3
variants:
  - name: fp8
    quantization: {format: fp8}
build:
  target: llmapi
  max_batch_size: 64
  max_input_len: 8192
  max_seq_len: 32768
quality_gate: {max_kl: 5e-2, min_top1_agreement: 0.9}
"""
HEAD = "model: {name: m, checkpoint: ckpt}\nvariants: [{name: bf16}]\n"
NOT_INT = "must be a whole number"

# id -> (file content, the command's words after `lpx`, what the message must contain)
CASES: dict[str, tuple[str | bytes, str, list[str]]] = {
    # 1. a key given twice: the second `build:` of the incident, at any depth, in flow style too
    "dup-build-llama": (
        LLAMA + "\nbuild:\n  target: torch\n",
        "quantize",
        [
            "key 'build' appears twice",
            f"lines {LLAMA_BUILD_LINE} and {len(LLAMA.splitlines()) + 2}",
            "delete one",
        ],
    ),
    "dup-nested": (
        QWEN + "tune:\n  grid:\n    max_batch_size: [64]\n    max_batch_size: [128]\n",
        "config validate",
        ["key 'max_batch_size' appears twice", "lines 20 and 21"],
    ),
    "dup-in-variant-item": (
        HEAD + "evaluation: {samples: 4, seq_len: 64, samples: 8}\n",
        "config validate",
        ["line 3: key 'samples' appears twice", "lines 3 and 3"],
    ),
    # 2. non-finite floats, named by field
    "inf-request-timeout-demo": (
        DEMO + "  openai: {request_timeout_s: .inf}\n",
        "quantize",
        ["serving.openai.request_timeout_s: must be a finite number, not .inf", "write a number"],
    ),
    "neg-inf-build-timeout": (
        QWEN.replace("  target: engine", "  timeout_s: -.inf"),
        "config validate",
        ["build.timeout_s", "-.inf"],
    ),
    "nan-quality-gate": (
        MISTRAL.replace("5e-2", ".nan"),
        "config validate",
        ["quality_gate.max_kl: must be a finite number, not .nan"],
    ),
    "overflow-to-inf": (
        MISTRAL.replace("5e-2", "1.0e999"),
        "config validate",
        ["quality_gate.max_kl", "finite"],
    ),
    # 3. integers bounded by their consumer, never coerced from true / "8" / 8.5
    "batch-1e12-qwen": (
        QWEN.replace("max_batch_size: 128", "max_batch_size: 1000000000000"),
        "quantize",
        ["build.max_batch_size: is 1000000000000", "at most 2147483647", "int32"],
    ),
    "seq-len-2-31": (
        MISTRAL.replace("32768", str(2**31)),
        "config validate",
        ["build.max_seq_len", "2147483647"],
    ),
    "bool-as-int": (
        QWEN.replace("  archs: [sm90]", "  tp_size: true"),
        "config validate",
        ["build.tp_size", NOT_INT, "not true"],
    ),
    "string-as-int": (
        MISTRAL.replace("max_batch_size: 64", 'max_batch_size: "64"'),
        "config validate",
        ["build.max_batch_size", "without quotes"],
    ),
    "float-as-int": (
        QWEN.replace("max_tokens_cap: 4096", "max_tokens_cap: 40.5"),
        "config validate",
        ["serving.max_tokens_cap", NOT_INT],
    ),
    "tune-grid-item": (
        HEAD + "tune: {grid: {max_num_tokens: [4096, 4294967296]}}\n",
        "config validate",
        ["tune.grid.max_num_tokens[1]", "2147483647"],
    ),
    "port-70000": (
        DEMO.replace("http_port: 0", "http_port: 70000"),
        "config validate",
        ["serving.http_port: is 70000", "at most 65535"],
    ),
    "timeout-zero": (
        HEAD + "serving: {ready_timeout_s: 0}\n",
        "config validate",
        ["serving.ready_timeout_s: is 0", "above 0"],
    ),
    "timeout-a-year": (
        HEAD + "build: {timeout_s: 31536000}\n",
        "config validate",
        ["build.timeout_s", "at most 604800", "a week"],
    ),
    "count-zero": (
        LLAMA.replace("samples: 512", "samples: 0"),
        "config validate",
        ["calibration.samples: is 0", "at least 1"],
    ),
    "yes-string-as-bool": (
        HEAD.replace("ckpt}", "ckpt, allow_pickle: 'yes'}"),
        "config validate",
        ["model.allow_pickle: must be true or false"],
    ),
    "number-as-name": (
        HEAD.replace("name: bf16", "name: 8"),
        "config validate",
        ["variants[0].name: must be text", "quotes"],
    ),
    # 4. names that become file names
    "variant-300-chars-mistral": (
        MISTRAL.replace("name: fp8", "name: " + "f" * 300),
        "quantize",
        ["variants[0].name: is 300 characters long; at most 100", "255 bytes", "shorten it"],
    ),
    "model-name-hub-id": (
        LLAMA.replace("name: llama-3.1-8b-instruct", "name: meta-llama/Llama-3.1-8B-Instruct"),
        "config validate",
        ["model.name: 'meta-llama/Llama-3.1-8B-Instruct' cannot be used as a name", "letters, digits"],
    ),
    # 5. one server's ports distinct, both fields named
    "http-equals-grpc": (
        DEMO.replace("http_port: 0", "http_port: 8001").replace("grpc_port: 0", "grpc_port: 8001"),
        "quantize",
        ["serving.http_port and serving.grpc_port are both 8001", "own port"],
    ),
    "gateway-equals-metrics": (
        HEAD + "serving: {metrics_port: 9000}\n",
        "config validate",
        ["serving.metrics_port and serving.openai.port are both 9000"],
    ),
    # 6. the file itself
    "latin-1": (
        HEAD.encode() + "# caf\xe9\n".encode("latin-1"),
        "config validate",
        ["line 3 is not UTF-8 (byte 0xe9)", "save the file as UTF-8"],
    ),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "quantize", ["is a binary file", "lpx init DIR"]),
    "utf-16": (HEAD.encode("utf-16"), "config validate", ["UTF-16", "save it as UTF-8"]),
    "empty": ("", "quantize", ["is empty", "model and variants"]),
    "comments-only": ("# model: {name: m}\n", "config validate", ["is empty (or only comments)"]),
    "top-level-list": (
        "- model: {name: m}\n- variants: []\n",
        "config validate",
        ["the top level is a list, not a mapping"],
    ),
    "top-level-scalar": (
        "llama-3.1-8b\n",
        "config validate",
        ["the top level is a single value", "key: value"],
    ),
    "syntax-error": (
        QWEN.replace("[sm90]", "[sm90"),
        "quantize",
        ["not valid YAML (line 12", "fix the YAML there"],
    ),
    "tab-indent": (
        HEAD + "build:\n\ttarget: torch\n",
        "config validate",
        ["(line 4, column 1)", "replace the tab with spaces"],
    ),
    "python-tag": (
        HEAD + "build: !!python/object:os.system {}\n",
        "config validate",
        ["not valid YAML (line 3", "remove the '!' tag"],
    ),
    # unknown keys: did-you-mean, or the section the key belongs in
    "typo-did-you-mean": (
        LLAMA.replace("max_num_tokens:", "max_num_token:"),
        "config validate",
        ["build.max_num_token: unknown key - did you mean 'max_num_tokens'?"],
    ),
    "key-in-wrong-section": (
        QWEN.replace("  max_tokens_cap: 4096", "  max_seq_len: 4096"),
        "config validate",
        ["serving.max_seq_len", "belongs in 'build'"],
    ),
}


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def _lpx(argv: tuple[str, ...]) -> None:
    """`lpx ARGV` through pipeline.cli.main, which maps errors to messages and exit codes."""
    saved = sys.argv
    sys.argv = ["lpx", *argv]
    try:
        main()
    finally:
        sys.argv = saved


def lpx(*argv: str):
    return CliRunner().invoke(_lpx, list(argv))


def _write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "lpx.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_broken_config_is_refused_with_its_fix(case: str, tmp_path: Path, isolated_home: Path) -> None:
    content, command, expected = CASES[case]
    path = _write(tmp_path, content)
    res = lpx(*command.split(), "-c", str(path))
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert res.stderr.startswith("error: ") and "Traceback" not in res.output
    assert "unexpected" not in res.stderr
    for text in expected:
        assert text in res.stderr, f"{text!r} not in:\n{res.stderr}"
    assert not (isolated_home / "artifacts").exists()


def test_at_least_22_broken_configs() -> None:
    assert len(CASES) >= 22


@pytest.mark.parametrize("text", [LLAMA, DEMO, QWEN, MISTRAL], ids=["llama", "demo", "qwen", "mistral"])
def test_the_real_configs_pass(text: str, tmp_path: Path) -> None:
    """The configs the broken cases are made from pass, so each refusal above is the change it makes."""
    res = lpx("config", "validate", "-c", str(_write(tmp_path, text)))
    assert res.exit_code == 0 and res.stdout.startswith("ok: model "), res.output


def test_anchors_and_merge_keys_work_as_yaml_defines(tmp_path: Path) -> None:
    """A key beside `<<: *anchor` overrides the merged one (not a duplicate); aliases share the value."""
    text = (
        HEAD.replace("[{name: bf16}]", "")
        + "  - name: fp8\n    quantization: &fp8 {format: fp8, kv_cache: fp8, exclude: [lm_head]}\n"
        "  - name: fp8-kv16\n    quantization:\n      <<: *fp8\n      kv_cache: none\n"
        "  - name: fp8-same\n    quantization: *fp8\n"
        "build: {max_input_len: 1000, max_seq_len: 2048}\n"
        "quality_gate: {max_kl: 5e-2, max_ppl_increase_pct: 1e1}\n"
    )
    cfg = load_config(_write(tmp_path, text))
    fp8, kv16, same = (v.quantization for v in cfg.variants)
    assert (fp8.format, fp8.kv_cache, fp8.exclude) == ("fp8", "fp8", ["lm_head"])
    assert (kv16.format, kv16.kv_cache, kv16.exclude) == ("fp8", "none", ["lm_head"])
    assert same == fp8
    # YAML 1.2 floats without a dot are numbers, not strings the strict schema would refuse
    assert cfg.quality_gate.max_kl == 0.05 and cfg.quality_gate.max_ppl_increase_pct == 10.0


def test_ports_that_cannot_collide_pass(tmp_path: Path) -> None:
    """0 picks a free port per server; a disabled gateway, or one on another explicit address, may reuse one."""
    for serving in (
        {"http_port": 0, "grpc_port": 0, "metrics_port": 0, "openai": {"port": 0}},
        {"http_port": 9000, "openai": {"enabled": False}},
        {"http_port": 9000, "host": "127.0.0.1", "openai": {"host": "10.0.0.5"}},
    ):
        path = _write(tmp_path, HEAD + yaml.safe_dump({"serving": serving}))
        assert load_config(path).serving.openai.port in (0, 9000)
    wildcard = {"http_port": 9000, "host": "0.0.0.0", "openai": {"host": "127.0.0.1"}}
    res = lpx("config", "validate", "-c", str(_write(tmp_path, HEAD + yaml.safe_dump({"serving": wildcard}))))
    assert res.exit_code == 2 and "serving.http_port and serving.openai.port are both 9000" in res.stderr


def test_the_limits_are_in_the_schema() -> None:
    from pipeline.config import json_schema

    props = json_schema()["$defs"]["Build"]["properties"]
    assert props["max_batch_size"]["maximum"] == 2**31 - 1 and "int32" in props["max_batch_size"]["limit"]
    assert json_schema()["$defs"]["Variant"]["properties"]["name"]["maxLength"] == 100


@pytest.mark.parametrize("case", ["dup-build-llama", "binary"])
def test_subprocess_exit_code_2_without_traceback(case: str, tmp_path: Path, isolated_home: Path) -> None:
    """The installed entry point, as a user runs it: exit code 2, the message, no traceback."""
    content, command, expected = CASES[case]
    path = _write(tmp_path, content)
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", *command.split(), "-c", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and all(text in res.stderr for text in expected), res.stderr
    assert not (isolated_home / "artifacts").exists()
