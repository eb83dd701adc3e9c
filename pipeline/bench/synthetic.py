"""Llama-shaped models with seeded random weights for the GPU benches (scripts/bench_quantize.py,
scripts/bench_engine.py): TinyLlama-1.1B's and Llama-3.1-8B's published shapes (pipeline/facts/models.py),
and the demo's tiny one for CPU smoke runs; the demo's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from ..facts.formats import FORMATS
from ..facts.models import DEMO_SHAPE, PUBLISHED, shape_of

_8B = PUBLISHED["llama-3.1-8b"]
SHAPES = {  # TinyLlama-1.1B's and Llama-3.1-8B's published shapes; 'tiny' (the demo's) for CPU smoke runs
    "1b": shape_of("tinyllama-1.1b"),
    "8b": {
        **shape_of("llama-3.1-8b"),
        **{k: _8B[k] for k in ("max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling")},
    },
    "tiny": DEMO_SHAPE,
}
ALL_FORMATS = list(FORMATS)


def write_model(dest: Path, shape: str) -> Path:
    """Seeded random bf16 weights, created directly on the GPU when there is one (no CPU init, no copy)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..demo import _train_tokenizer, corpus_text, paragraphs

    torch.manual_seed(0)
    tok = _train_tokenizer(paragraphs(corpus_text()), vocab_size=512)
    cfg = LlamaConfig(
        **{"max_position_embeddings": 4096, **SHAPES[shape]},
        architectures=["LlamaForCausalLM"],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialize in bf16: no fp32 copy of 8B weights
    try:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    del model
    return dest
