"""Published config.json values of the models LPX plans for and tests against (from each model's
config.json on the Hugging Face Hub), in the Hub's own spelling (transformers 4.x: rope_theta +
rope_scaling), and the demo's tiny shape.

`lpx plan --preset` reads the shapes; the export cross-check's tests put the numerics fields (rope,
norm, activation, tied embeddings, window) on tiny seeded weights; scripts/bench_quantize.py builds
random models of these shapes. An entry holds only fields taken from the published file.
"""

from __future__ import annotations

# The keys that size a decoder; the rest of an entry is numerics (rope, norms, activation, window).
SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

PUBLISHED: dict[str, dict] = {
    "llama-3.2-1b": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        rope_theta=500000.0,
        rope_scaling={"factor": 32.0, **_LLAMA3_ROPE, "rope_type": "llama3"},
        max_position_embeddings=131072,
        rms_norm_eps=1e-05,
        hidden_act="silu",
        tie_word_embeddings=True,
    ),
    "llama-3.2-3b": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=True,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rope_theta=500000.0,
        rope_scaling={"factor": 8.0, **_LLAMA3_ROPE, "rope_type": "llama3"},
        max_position_embeddings=131072,
        rms_norm_eps=1e-05,
        hidden_act="silu",
        tie_word_embeddings=False,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        rope_theta=1000000.0,
        rope_scaling=None,
        max_position_embeddings=32768,
        rms_norm_eps=1e-06,
        hidden_act="silu",
        tie_word_embeddings=True,
        sliding_window=32768,
        use_sliding_window=False,
        max_window_layers=21,
    ),
    "mistral-7b": dict(  # v0.3 (its vocabulary)
        model_type="mistral",
        architectures=["MistralForCausalLM"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=32768,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-05,
        hidden_act="silu",
        tie_word_embeddings=False,
        sliding_window=None,
    ),
    "tinyllama-1.1b": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
}
# `lpx plan --preset` names (each a full shape in PUBLISHED)
PRESETS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-7b", "mistral-7b")
# The demo's tiny Llama (pipeline/demo.py): grouped-query attention, a vocabulary its tokenizer fills.
DEMO_SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)


def shape_of(name: str) -> dict:
    """The shape keys of a published entry."""
    return {k: v for k, v in PUBLISHED[name].items() if k in SHAPE_KEYS}


def numerics_of(name: str) -> dict:
    """The published entry without its shape keys (what a tiny stand-in model keeps)."""
    return {k: v for k, v in PUBLISHED[name].items() if k not in SHAPE_KEYS}
