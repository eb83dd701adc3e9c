"""Export cross-check (issue 12): real ModelOpt exports of tiny seeded models whose config.json carries
real models' RoPE / norm / activation / tie / window settings; TensorRT-LLM's names from
tests/contracts/trtllm_checkpoint.json and pipeline/stages/quantize/export_check.py's sources."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers_models import REAL_CONFIGS, write_tiny_model
from rich.console import Console

from pipeline.config import parse_config
from pipeline.errors import LpxError
from pipeline.progress import Reporter
from pipeline.runner import Runner
from pipeline.stages.quantize.export_check import check_trtllm
from pipeline.stages.quantize.source_config import read_rope, source_fields

LLAMA31_ROPE = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def quiet() -> Reporter:
    return Reporter(Console(file=open("/dev/null", "w")))


def quantize(ckpt, fmt="fp8", target="engine", exports=(), **build):
    cfg = parse_config(
        {
            "model": {"name": ckpt.name, "checkpoint": str(ckpt)},
            "variants": [
                {
                    "name": fmt,
                    "quantization": {"format": fmt, "exclude": ["*lm_head*"], "exports": list(exports)},
                }
            ],
            "calibration": {"samples": 4, "seq_len": 32, "batch_size": 2},
            "build": {"archs": ["sm90"], "target": target, "max_input_len": 256, "max_seq_len": 512, **build},
        }
    )
    runner = Runner(cfg, quiet())
    return runner.quantize(cfg.variants[0])


def test_both_config_styles_read_the_same():
    v4 = {"rope_theta": 500000.0, "rope_scaling": dict(LLAMA31_ROPE), "max_position_embeddings": 131072}
    v5 = {"rope_parameters": {**LLAMA31_ROPE, "rope_theta": 500000.0}, "max_position_embeddings": 131072}
    assert read_rope(v4) == read_rope(v5) == (500000.0, LLAMA31_ROPE)
    # 4.x "type" spelling and transformers' defaults (yarn: beta 32/1, original = max positions)
    yarn4 = {
        "rope_theta": 1e6,
        "rope_scaling": {"type": "yarn", "factor": 4.0},
        "max_position_embeddings": 131072,
    }
    assert read_rope(yarn4)[1] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 131072,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
    }
    assert read_rope({"max_position_embeddings": 2048}) == (10000.0, {"rope_type": "default"})
    assert (
        source_fields(
            {
                "num_attention_heads": 4,
                "hidden_size": 64,
                "vocab_size": 8,
                "sliding_window": 4096,
                "use_sliding_window": False,
            }
        )["sliding_window"]
        is None
    )


@pytest.fixture
def demo_llama31(tiny_checkpoint, tmp_path):
    """The demo checkpoint with Llama-3.1-8B's rope settings (transformers 4.x spelling, as on the Hub)."""
    ckpt = tmp_path / "demo31"
    shutil.copytree(tiny_checkpoint, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(rope_theta=500000.0, rope_scaling=dict(LLAMA31_ROPE), max_position_embeddings=131072)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


@pytest.mark.slow
def test_demo_with_llama31_rope_exports_what_trtllm_expects(demo_llama31):
    art = quantize(demo_llama31, exports=["hf"])
    trt = json.loads((art.path / "trtllm" / "config.json").read_text())
    # LLaMAConfig.from_hugging_face: rotary_base <- rope_theta, rotary_scaling <- rope_scaling
    assert trt["rotary_base"] == 500000.0
    assert trt["rotary_scaling"] == {"type": "llama3", "rope_type": "llama3", **LLAMA31_ROPE}
    fixed = art.manifest["results"]["export_check"]["fixed"]
    assert any("rotary_base" in f for f in fixed) and any("rotary_scaling" in f for f in fixed)
    # the unified HF checkpoint keeps rope_parameters and gains the 4.x keys; both readers agree
    hf = json.loads((art.path / "hf" / "config.json").read_text())
    assert hf["rope_theta"] == 500000.0 and hf["rope_scaling"]["rope_type"] == "llama3"
    from transformers import AutoConfig

    assert (
        AutoConfig.from_pretrained(art.path / "hf").rope_parameters
        == AutoConfig.from_pretrained(demo_llama31).rope_parameters
    )
    assert art.manifest["results"]["export_check"]["checked"] == ["trtllm", "hf"]


EXPECTED_SCALING = {
    "llama-3.1-8b": {
        "type": "llama3",
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "llama-3.2-1b": {
        "type": "llama3",
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "qwen2.5-0.5b": None,
    "mistral-7b-v0.3": None,
    "qwen2.5-7b-yarn": {
        "type": "yarn",
        "rope_type": "yarn",
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 32768,
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_CONFIGS))
def test_real_model_configs_survive_every_export(name, tmp_path):
    from safetensors import safe_open
    from transformers import AutoConfig

    ckpt = write_tiny_model(tmp_path / name, name)
    src = REAL_CONFIGS[name]
    art = quantize(ckpt, target="torch", exports=["trtllm", "hf"])
    assert art.manifest["results"]["exports"] == ["hf", "state", "trtllm"]
    trt = json.loads((art.path / "trtllm" / "config.json").read_text())
    assert trt["rotary_base"] == src["rope_theta"]
    assert trt.get("rotary_scaling") == EXPECTED_SCALING[name]
    assert trt["norm_epsilon"] == src["rms_norm_eps"] and trt["hidden_act"] == "silu"
    assert trt["head_size"] == 16 and trt["num_key_value_heads"] == 2
    assert trt["max_position_embeddings"] == src["max_position_embeddings"]
    assert trt["vocab_size"] == json.loads((ckpt / "config.json").read_text())["vocab_size"]
    with safe_open(str(art.path / "trtllm" / "rank0.safetensors"), "pt") as f:
        keys = set(f.keys())
        if src["tie_word_embeddings"]:  # tied: TensorRT-LLM gets the embedding as its lm_head
            import torch

            assert torch.equal(
                f.get_tensor("lm_head.weight"), f.get_tensor("transformer.vocab_embedding.weight")
            )
    assert trt["share_embedding_table"] or "lm_head.weight" in keys
    hf_cfg, src_cfg = AutoConfig.from_pretrained(art.path / "hf"), AutoConfig.from_pretrained(ckpt)
    assert hf_cfg.rope_parameters == src_cfg.rope_parameters
    assert hf_cfg.tie_word_embeddings == src["tie_word_embeddings"]
    assert getattr(hf_cfg, "sliding_window", None) == getattr(src_cfg, "sliding_window", None)
    # the check passes on its own output: nothing left to fix
    assert check_trtllm(json.loads((ckpt / "config.json").read_text()), art.path / "trtllm", "again") == []


@pytest.mark.slow
def test_a_conflicting_value_is_refused_with_both_values(demo_llama31):
    art = quantize(demo_llama31)
    path = art.path / "trtllm" / "config.json"
    trt = json.loads(path.read_text())
    trt["rotary_base"] = 10000.0  # what TensorRT-LLM's own converter writes when it finds no rope_theta
    path.write_text(json.dumps(trt))
    with pytest.raises(LpxError) as err:
        check_trtllm(
            json.loads((demo_llama31 / "config.json").read_text()), art.path / "trtllm", "variant 'fp8'"
        )
    msg = err.value.message
    assert "rotary_base" in msg and "500000.0" in msg and "10000.0" in msg


@pytest.mark.slow
def test_longrope_on_a_llama_checkpoint_is_refused_before_commit(tiny_checkpoint, tmp_path, isolated_home):
    """TensorRT-LLM applies LongRoPE only through Phi-3's config: no certain mapping for a LLaMA checkpoint."""
    ckpt = tmp_path / "longrope"
    shutil.copytree(tiny_checkpoint, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    half = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
    cfg.update(
        rope_theta=10000.0,
        max_position_embeddings=4096,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0] * half,
            "long_factor": [2.0] * half,
            "original_max_position_embeddings": 2048,
            "factor": 2.0,
        },
    )
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LpxError) as err:
        quantize(ckpt)
    msg = err.value.message
    assert (
        "rotary_scaling: the source config says rope_type longrope" in msg
        and "the export has no value" in msg
    )
    slot = isolated_home / "artifacts" / "checkpoints" / "longrope" / "fp8" / "any"
    assert not [p for p in slot.iterdir() if p.name != ".lock"], "a refused export must leave nothing behind"


def test_a_sliding_window_shorter_than_max_seq_len_is_refused_before_work(tmp_path, isolated_home):
    ckpt = write_tiny_model(tmp_path / "mistral01", "mistral-7b-v0.3", sliding_window=256)
    with pytest.raises(LpxError) as err:
        quantize(ckpt)
    assert err.value.exit_code == 2
    assert "sliding_window" in err.value.message and "256" in err.value.message and "512" in err.value.message
    assert not (isolated_home / "artifacts").exists()


def test_llmapi_options_must_not_contradict_the_checkpoint():
    from pipeline.stages.quantize.export_check import check_llmapi_options

    src = {
        "num_attention_heads": 4,
        "hidden_size": 64,
        "vocab_size": 8,
        "max_position_embeddings": 2048,
        "sliding_window": 4096,
    }
    check_llmapi_options(src, {"max_seq_len": 2048, "max_batch_size": 8}, "v")
    with pytest.raises(
        LpxError, match="max_seq_len 4096 but the checkpoint's max_position_embeddings is 2048"
    ):
        check_llmapi_options(src, {"max_seq_len": 4096}, "v")
    with pytest.raises(
        LpxError, match="sliding_window: the source config says 1024 .* build.max_seq_len 2048"
    ):
        check_llmapi_options({**src, "sliding_window": 1024}, {"max_seq_len": 2048}, "v")
    with pytest.raises(LpxError, match="would override model fields rope_theta, vocab_size"):
        check_llmapi_options(src, {"max_seq_len": 64, "rope_theta": 1.0, "vocab_size": 8}, "v")
