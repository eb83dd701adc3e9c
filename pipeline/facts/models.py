"""Published config.json values of the models LPX plans for and tests against (from each model's
config.json on the Hugging Face Hub), in the Hub's own spelling (transformers 4.x: rope_theta +
rope_scaling), and the demo's tiny shape.

`lpx plan --preset` reads the shapes; the export cross-check's tests put the numerics fields (rope,
norm, activation, tied embeddings, window) on tiny seeded weights; scripts/bench_quantize.py builds
random models of these shapes. An entry holds only fields taken from the published file.
"""

from __future__ import annotations

# The keys that size a decoder; the rest of an entry is numerics (rope, norms, activation, window).
_DECODER_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
SHAPE_KEYS = (*_DECODER_KEYS, "head_dim")


def decoder(
    hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, head_dim=None
) -> dict:
    """The shape keys of a decoder config, in config.json's names."""
    shape = dict(zip(_DECODER_KEYS, (hidden, intermediate, layers, heads, kv_heads, vocab), strict=True))
    return shape | ({"head_dim": head_dim} if head_dim else {})


_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"])
_QWEN2 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
_SILU_NORM = dict(hidden_act="silu", rms_norm_eps=1e-05)


def _llama3_rope(factor: float) -> dict:
    return dict(
        rope_theta=500000.0,
        rope_scaling={
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        max_position_embeddings=131072,
    )


PUBLISHED: dict[str, dict] = {
    "llama-3.2-1b": {
        **_LLAMA,
        **decoder(2048, 8192, 16, 32, 8, 128256, head_dim=64),
        **_llama3_rope(32.0),
        **_SILU_NORM,
        "tie_word_embeddings": True,
    },
    "llama-3.2-3b": {
        **_LLAMA,
        **decoder(3072, 8192, 28, 24, 8, 128256, head_dim=128),
        "tie_word_embeddings": True,
    },
    "llama-3.1-8b": {
        **_LLAMA,
        **decoder(4096, 14336, 32, 32, 8, 128256, head_dim=128),
        **_llama3_rope(8.0),
        **_SILU_NORM,
        "tie_word_embeddings": False,
    },
    "qwen2.5-7b": {
        **_QWEN2,
        **decoder(3584, 18944, 28, 28, 4, 152064, head_dim=128),
        "tie_word_embeddings": False,
    },
    "qwen2.5-0.5b": {
        **_QWEN2,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "max_position_embeddings": 32768,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "max_window_layers": 21,
    },
    "mistral-7b": {  # v0.3 (its vocabulary)
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        **decoder(4096, 14336, 32, 32, 8, 32768, head_dim=128),
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        **_SILU_NORM,
        "tie_word_embeddings": False,
        "sliding_window": None,
    },
    "tinyllama-1.1b": {**_LLAMA, **decoder(2048, 5632, 22, 32, 4, 32000)},
}

# `lpx plan --preset` names (each a full shape in PUBLISHED)
PRESETS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-7b", "mistral-7b")
# The demo's tiny Llama (pipeline/demo.py): grouped-query attention, a vocabulary its tokenizer fills.
DEMO_SHAPE = decoder(128, 256, 2, 4, 2, 512)


def shape_of(name: str) -> dict:
    """The shape keys of a published entry."""
    return {k: v for k, v in PUBLISHED[name].items() if k in SHAPE_KEYS}


def numerics_of(name: str) -> dict:
    """The published entry without its shape keys (what a tiny stand-in model keeps)."""
    return {k: v for k, v in PUBLISHED[name].items() if k not in SHAPE_KEYS}
