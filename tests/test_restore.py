"""Restoring without weight initialization (issue 12): the meta-device path gives exactly the model the
old `from_config` + `mto.restore` path gave - every tensor, the non-persistent RoPE buffers, weight ties
and the logits - for untied and tied models, default and scaled RoPE, FP8 and INT4-AWQ."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from helpers_models import write_tiny_model
from rich.console import Console

from pipeline.config import parse_config
from pipeline.progress import Reporter
from pipeline.runner import Runner
from pipeline.stages.quantize.model_io import STATE_FILE


def old_restore(state, dtype):
    """The path LPX used before: random init on the CPU, then mto.restore overwrites it."""
    import modelopt.torch.opt as mto
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(state), dtype=dtype)
    with contextlib.redirect_stdout(io.StringIO()):
        mto.restore(model, str(state / STATE_FILE))
    return model.eval()


def quantized_state(ckpt, fmt, target="torch"):
    cfg = parse_config(
        {
            "model": {"name": ckpt.name, "checkpoint": str(ckpt)},
            "variants": [{"name": fmt, "quantization": {"format": fmt, "awq_block_size": 32}}],
            "calibration": {"samples": 4, "seq_len": 32, "batch_size": 2},
            "build": {"archs": ["sm90"], "target": target, "max_input_len": 256, "max_seq_len": 512},
        }
    )
    runner = Runner(cfg, Reporter(Console(file=open("/dev/null", "w"))))
    return runner, runner.quantize(cfg.variants[0])


@pytest.fixture(scope="module")
def models(tiny_checkpoint, tmp_path_factory):
    base = tmp_path_factory.mktemp("restore_models")
    return {
        "demo": tiny_checkpoint,
        "llama-3.2-1b": write_tiny_model(base / "llama32", "llama-3.2-1b"),  # tied, llama3 rope
        "qwen2.5-7b-yarn": write_tiny_model(base / "qwen_yarn", "qwen2.5-7b-yarn"),  # yarn, qkv bias
    }


def assert_same_model(new, old, tied: bool):
    import torch

    new_sd, old_sd = new.state_dict(), old.state_dict()
    assert new_sd.keys() == old_sd.keys()
    for k in old_sd:
        assert new_sd[k].dtype == old_sd[k].dtype and torch.equal(new_sd[k], old_sd[k]), k
    new_buf, old_buf = dict(new.named_buffers()), dict(old.named_buffers())
    rope = [k for k in old_buf if k.endswith("inv_freq")]
    assert rope, "the model has RoPE buffers to compare"
    for k in rope:  # non-persistent: not in the state dict, computed at build time
        assert torch.equal(new_buf[k], old_buf[k]), k
    assert new.model.rotary_emb.attention_scaling == old.model.rotary_emb.attention_scaling
    assert (new.lm_head.weight.data_ptr() == new.model.embed_tokens.weight.data_ptr()) is tied
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(new(input_ids=ids).logits, old(input_ids=ids).logits)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8", "int4_awq"])
@pytest.mark.parametrize("name", ["demo", "llama-3.2-1b", "qwen2.5-7b-yarn"])
def test_meta_device_restore_is_bit_identical(models, name, fmt, isolated_home):
    import torch

    from pipeline.stages.quantize.model_io import restore

    _, art = quantized_state(models[name], fmt)
    state = art.path / "state"
    new, how = restore(state, "bfloat16", "cpu")
    assert how.startswith("meta device")
    tied = json.loads((models[name] / "config.json").read_text()).get("tie_word_embeddings", False)
    assert_same_model(new, old_restore(state, torch.bfloat16), tied)


@pytest.mark.slow
def test_torch_engine_load_model_uses_the_meta_path_and_matches(models, isolated_home):
    import torch

    from pipeline.runtime.engines.torch_engine import load_model

    runner, art = quantized_state(models["llama-3.2-1b"], "fp8")
    engine = runner.build(runner.cfg.variants[0], art, "any")
    # fast=False: the live ModelOpt model, whose state dict is the restored one (the fast path folds the
    # weight quantizers into the weights: tests/test_torch_fast.py compares that one by its logits)
    assert_same_model(
        load_model(engine.path, fast=False), old_restore(engine.path, torch.bfloat16), tied=True
    )


@pytest.mark.slow
def test_hf_export_after_trtllm_restores_through_the_meta_path(models, isolated_home):
    _, art = quantized_state(models["demo"], "fp8", target="llmapi")
    r = art.manifest["results"]
    assert "restore_s" not in r["timings"], (
        "with no TensorRT-LLM export the calibrated model is exported directly"
    )
    cfg = parse_config(
        {
            "model": {"name": "demo", "checkpoint": str(models["demo"])},
            "variants": [{"name": "fp8", "quantization": {"format": "fp8", "exports": ["trtllm"]}}],
            "calibration": {"samples": 4, "seq_len": 32, "batch_size": 2},
            "build": {"archs": ["sm90"], "target": "llmapi", "max_input_len": 256, "max_seq_len": 512},
            # no gate, so no state/ export: the TensorRT-LLM export's clean copy comes from a scratch state
            "quality_gate": {"max_kl": None, "min_top1_agreement": None, "max_ppl_increase_pct": None},
        }
    )
    both = Runner(cfg, Reporter(Console(file=open("/dev/null", "w")))).quantize(cfg.variants[0])
    r = both.manifest["results"]
    assert (
        r["exports"] == ["hf", "trtllm"] and "restore: meta device + to_empty (no weight init)" in r["notes"]
    )
    assert r["timings"]["restore_s"] > 0
    assert not (both.path / ".clean-copy-state").exists(), (
        "the state written only for the clean copy is removed"
    )


@pytest.mark.slow
def test_a_buffer_lpx_cannot_compute_falls_back_to_from_config(models, isolated_home, monkeypatch):
    import torch

    from pipeline.runtime import restore as restore_mod
    from pipeline.stages.quantize.model_io import restore

    def drifted(module):  # as if a later transformers renamed what the rotary module keeps
        raise AttributeError("no compute_default_rope_parameters")

    _, art = quantized_state(models["demo"], "fp8")
    monkeypatch.setattr(restore_mod, "_rope_buffers", drifted)
    model, how = restore(art.path / "state", "bfloat16", "cpu")
    assert how.startswith("from_config (random init): LPX cannot compute LlamaRotaryEmbedding")
    assert_same_model(model, old_restore(art.path / "state", torch.bfloat16), tied=False)
