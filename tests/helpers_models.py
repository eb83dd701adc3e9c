"""Import LPX's Triton python models (model_repo/<name>/model.py) outside Triton, for unit tests."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

from pipeline.facts.models import decoder, numerics_of

ROOT = Path(__file__).resolve().parents[1]


def load_model_module(name: str) -> types.ModuleType:
    """Import model_repo/<name>/model.py with a stand-in for Triton's triton_python_backend_utils
    (only the FINAL flag constant is needed at import time)."""
    sys.modules.setdefault(
        "triton_python_backend_utils", types.SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=1)
    )
    spec = importlib.util.spec_from_file_location(
        f"lpx_model_{name}", ROOT / "model_repo" / name / "model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Tiny stand-ins for real models: each published config.json's rope / norm / activation / tie / window
# settings (pipeline/facts/models.py, in the Hub's transformers 4.x spelling) on small, seeded weights.
TINY = decoder(64, 128, 2, 4, 2, 512)
REAL_CONFIGS = {
    "llama-3.1-8b": numerics_of("llama-3.1-8b"),
    "llama-3.2-1b": {**numerics_of("llama-3.2-1b"), "head_dim": 16},
    "qwen2.5-0.5b": numerics_of("qwen2.5-0.5b"),
    "mistral-7b-v0.3": {**numerics_of("mistral-7b"), "head_dim": 16},
    # Qwen2.5-7B-Instruct's documented long-context setting (its model card's rope_scaling for YaRN)
    "qwen2.5-7b-yarn": dict(
        **numerics_of("qwen2.5-7b"),
        rope_theta=1000000.0,
        rope_scaling={"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
        max_position_embeddings=131072,
        rms_norm_eps=1e-06,
        hidden_act="silu",
        sliding_window=131072,
        use_sliding_window=False,
    ),
}


def write_tiny_model(dest: Path, name: str, seed: int = 0, **override) -> Path:
    """A seeded tiny checkpoint (safetensors + the demo's tokenizer) whose config.json carries the real
    model's settings in the transformers 4.x spelling (rope_theta / rope_scaling), as the Hub ships them."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.demo import _train_tokenizer, corpus_text, paragraphs

    raw = {**TINY, **REAL_CONFIGS[name], **override}
    tok = _train_tokenizer(paragraphs(corpus_text()), vocab_size=TINY["vocab_size"])
    raw.update(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        vocab_size=len(tok),
    )
    model_type = raw.pop("model_type")
    config = AutoConfig.for_model(model_type, **raw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    # write the Hub's 4.x spelling, so both readers of the source config are exercised
    saved = json.loads((dest / "config.json").read_text())
    saved.pop("rope_parameters", None)
    saved["rope_theta"] = raw["rope_theta"]
    saved["rope_scaling"] = raw.get("rope_scaling")
    (dest / "config.json").write_text(json.dumps(saved, indent=2))
    return dest
