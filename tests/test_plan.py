"""lpx plan: arithmetic checked against hand-computed figures for published model configs."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from pipeline.cli.tools import plan as plan_command
from pipeline.errors import LpxError
from pipeline.facts.gpu import GPUS, find_gpu, lookup_gpu
from pipeline.inspection.plan import PRESETS, kv_bytes_per_token, load_shape, plan, weight_bytes

LLAMA8B = PRESETS["llama-3.1-8b"]


def row(result: dict, fmt: str) -> dict:
    return next(r for r in result["formats"] if r["format"] == fmt)


def test_llama_31_8b_kv_is_128_kib_per_token_in_bf16():
    assert kv_bytes_per_token(LLAMA8B, "bf16") == 128 * 1024
    assert kv_bytes_per_token(LLAMA8B, "fp8") == 64 * 1024
    # GQA: Qwen2.5-7B has 4 KV heads for 28 query heads -> 2 x 28 x 4 x 128 x 2 bytes
    assert kv_bytes_per_token(PRESETS["qwen2.5-7b"], "bf16") == 57344


def test_llama_31_8b_params_and_weights():
    assert LLAMA8B.params == pytest.approx(8.03e9, rel=0.005)
    fp8 = weight_bytes(LLAMA8B, "fp8")
    # 6.98e9 one-byte linear weights; embeddings and lm_head (2 x 128256 x 4096) stay bf16
    assert fp8["quantized_bytes"] == pytest.approx(6.98e9, rel=0.01)
    assert fp8["high_precision_bytes"] == pytest.approx(2.10e9, rel=0.01)
    assert fp8["weight_bytes"] == pytest.approx(9.08e9, rel=0.01)  # what FP8 checkpoints of it weigh
    # the often-quoted "~8.0 GB in FP8" is every parameter at one byte, embeddings and lm_head included;
    # ModelOpt's FP8 recipe keeps those two in bf16, which is the 1.05 GB difference
    assert fp8["quantized_bytes"] + fp8["high_precision_bytes"] / 2 == pytest.approx(8.03e9, rel=0.01)
    assert weight_bytes(LLAMA8B, "none")["weight_bytes"] == pytest.approx(2 * LLAMA8B.params, rel=1e-6)


def test_scales_per_format():
    m = LLAMA8B
    linear = sum(a * b for a, b in m.linears()) * m.layers
    awq = weight_bytes(m, "int4_awq")
    assert awq["quantized_bytes"] == linear // 2
    groups = sum((a // 128) * b for a, b in m.linears()) * m.layers
    assert awq["scale_bytes"] >= groups * 2  # one bf16 scale per 128-element group
    nvfp4 = weight_bytes(m, "nvfp4")
    assert nvfp4["scale_bytes"] == pytest.approx(linear / 16, rel=1e-3)  # one FP8 scale per 16 weights
    assert weight_bytes(m, "fp8")["scale_bytes"] == 8 * 7 * m.layers  # per-tensor fp32 weight + input scales


def test_tied_embeddings_counted_once():
    m = PRESETS["llama-3.2-1b"]
    assert m.params == pytest.approx(1.236e9, rel=0.005)


def test_fit_and_roofline_on_h200():
    result = plan(LLAMA8B, lookup_gpu("h200"), seq_len=8192)
    fp8 = row(result, "fp8")
    pool = (143771 * 2**20 - fp8["weight_bytes"] - result["runtime_overhead_bytes"]) * 0.9
    assert fp8["fit_sequences"] == int(pool // (8192 * 128 * 1024))
    assert fp8["tokens_per_s_batch1"] == pytest.approx(
        4.8e12 / (fp8["weight_bytes"] + 8192 * 131072), rel=1e-9
    )
    assert fp8["tokens_per_s_at_fit"] > 5 * fp8["tokens_per_s_batch1"]
    assert fp8["suggested_max_batch_size"] == 64 and fp8["runs_on_gpu"]
    assert row(result, "nvfp4")["runs_on_gpu"] is False
    assert result["warnings"] == []


def test_max_seq_len_warning_and_no_room():
    result = plan(LLAMA8B, lookup_gpu("h100"), seq_len=2048, max_seq_len=32768)
    assert any("max_seq_len 32768" in w for w in result["warnings"])
    assert row(result, "fp8")["fit_sequences_at_max_seq_len"] < row(result, "fp8")["fit_sequences"] / 8
    small = plan(dataclasses.replace(LLAMA8B, layers=64), lookup_gpu("a10g"))  # ~30 GB in bf16
    assert row(small, "none")["fit_sequences"] is None and any("no room" in w for w in small["warnings"])


@pytest.mark.parametrize(
    "name,key",
    [
        ("h200", "h200"),
        ("NVIDIA H200", "h200"),
        ("H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA B200", "b200"),
    ],
)
def test_gpu_lookup(name, key):
    assert find_gpu(name).key == key


def test_gpu_table_and_unknown():
    assert find_gpu("NVIDIA L40") is None and find_gpu("GH200 480GB") is None
    assert all(g.source for g in GPUS.values())
    assert GPUS["b200"].nvfp4 and not GPUS["h200"].nvfp4 and GPUS["l4"].fp8 and not GPUS["a100-80gb"].fp8
    with pytest.raises(LpxError, match="use one of"):
        lookup_gpu("Tesla T4")


def test_model_config_file_and_checkpoint(tmp_path):
    cfg = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = load_shape(tmp_path, None, None)
    assert kv_bytes_per_token(shape) == 131072 and shape.params == LLAMA8B.params
    assert load_shape(None, tmp_path / "config.json", None).head_dim == 128
    with pytest.raises(LpxError, match="exactly one"):
        load_shape(tmp_path, None, "llama-3.1-8b")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(LpxError, match="no num_attention_heads"):
        load_shape(None, tmp_path / "bad.json", None)


def test_cli_json_and_table():
    out = CliRunner().invoke(
        plan_command, ["--preset", "llama-3.1-8b", "--gpu", "NVIDIA H200", "--seq-len", "8192", "--json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["kv_bytes_per_token"]["bf16"] == 131072 and data["gpu"]["key"] == "h200"
    assert set(row(data, "fp8")) >= {
        "weight_bytes",
        "fit_sequences",
        "tokens_per_s_batch1",
        "suggested_max_num_tokens",
    }
    table = CliRunner().invoke(plan_command, ["--preset", "mistral-7b", "--gpu", "l40s"])
    assert table.exit_code == 0 and "int4_awq" in table.output and "128 KiB" in table.output
    bad = CliRunner().invoke(plan_command, ["--preset", "gpt-5"])
    assert isinstance(bad.exception, LpxError) and "llama-3.1-8b" in bad.exception.message
