"""Quantization recipes in ModelOpt's current form (an ordered list of quantizer entries), and the shape
checks a format's export must pass (tp_size against the heads, AWQ groups against each rank's slice).
What each format needs from the GPU and TensorRT-LLM is in pipeline/facts/."""

from __future__ import annotations

import copy

from ...config import Quantization
from ...errors import UsageError
from ...facts.formats import FORMATS, refusal

KV_ENTRIES = {
    "fp8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}}],
    "int8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}],
}


def check_shapes(q: Quantization, config: dict, tp_size: int, where: str) -> None:
    """tp_size must split the attention heads; AWQ groups must fit each rank's slice of the weights."""
    heads = int(config.get("num_attention_heads", 0))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    if heads and heads % tp_size:
        raise UsageError(
            f"build.tp_size {tp_size} does not divide the model's {heads} attention heads - "
            f"use a tp_size that divides {heads}"
        )
    if kv_heads and kv_heads % tp_size and tp_size % kv_heads:
        raise UsageError(
            f"build.tp_size {tp_size} cannot split the model's {kv_heads} key/value heads - "
            f"use a divisor or multiple of {kv_heads}"
        )
    if FORMATS[q.format].awq:
        for key in ("hidden_size", "intermediate_size"):
            dim = int(config.get(key, 0))
            if dim and (dim // tp_size) % q.awq_block_size:
                raise UsageError(
                    f"{where}: awq_block_size {q.awq_block_size} does not divide {key} {dim} / tp_size {tp_size} "
                    f"= {dim // tp_size} - use a block size that divides it (64 or 32) or a smaller tp_size"
                )


def recipe(q: Quantization) -> dict | None:
    """The ModelOpt config for a variant, or None for `none` (no quantization)."""
    import modelopt.torch.quantization as mtq

    why = refusal(q.format, q.kv_cache)  # the config refused it; a config built in code is checked here
    if why:
        raise UsageError(why)
    name = FORMATS[q.format].modelopt_config
    if name is None:
        return None
    cfg = copy.deepcopy(getattr(mtq, name))
    entries = list(cfg["quant_cfg"])
    if FORMATS[q.format].awq:
        for e in entries:
            c = e.get("cfg")
            if e.get("quantizer_name") == "*weight_quantizer":
                for item in c if isinstance(c, list) else [c]:
                    if (
                        isinstance(item, dict)
                        and isinstance(item.get("block_sizes"), dict)
                        and -1 in item["block_sizes"]
                    ):
                        item["block_sizes"][-1] = q.awq_block_size
    entries += copy.deepcopy(KV_ENTRIES.get(q.kv_cache, []))
    for pattern in q.exclude:
        entries.append(
            {"quantizer_name": pattern if pattern.endswith("*") else pattern + "*", "enable": False}
        )
    cfg["quant_cfg"] = entries
    return cfg
