"""The numerics fields of a source Hugging Face config, read in either spelling and normalized, so that
the export cross-check (export_check.py) compares meanings, not spellings.

  transformers 5: `rope_parameters` {rope_type, rope_theta, factor, ...}
  transformers 4.x: `rope_theta` + `rope_scaling` {type | rope_type, factor, ...} (null: plain RoPE)
  rope types: default, linear, dynamic, yarn, llama3, longrope (transformers' modeling_rope_utils.py)
"""

from __future__ import annotations

import math

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
DEFAULT_THETA = (
    10000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta and LLaMAConfig's rotary_base
)


def text_config(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def number(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def read_rope(cfg: dict) -> tuple[float, dict]:
    """(rope base, scaling) of an HF config dict in either style. Scaling is {"rope_type": ..., params}
    with transformers' defaults applied (so two configs that differ only in spelling compare equal)."""
    cfg = text_config(cfg)
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params and not all(isinstance(v, dict) for v in params.values()):
        raw = dict(params)
    else:
        raw = dict(cfg.get("rope_scaling") or {})
    theta = raw.pop("rope_theta", None)
    if theta is None:
        theta = cfg.get("rope_theta", DEFAULT_THETA)
    rope_type = raw.pop("rope_type", None) or raw.pop("type", None) or "default"
    raw.pop("type", None)
    partial = raw.pop("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    scaling = {"rope_type": rope_type, **{k: v for k, v in raw.items() if v is not None}}
    if partial is not None:
        scaling["partial_rotary_factor"] = float(partial)
    if rope_type in ("llama3", "yarn", "longrope"):
        scaling.setdefault(
            "original_max_position_embeddings",
            cfg.get("original_max_position_embeddings") or cfg.get("max_position_embeddings"),
        )
    if rope_type == "yarn":
        scaling.setdefault("beta_fast", 32.0)
        scaling.setdefault("beta_slow", 1.0)
        scaling.setdefault("truncate", True)
    return float(theta), scaling


def yarn_attention_factor(s: dict) -> float:
    """The attention factor transformers' `_compute_yarn_parameters` derives when none is given."""
    factor = s.get("factor") or 1.0

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.get("mscale") and s.get("mscale_all_dim"):
        return float(get_mscale(factor, s["mscale"]) / get_mscale(factor, s["mscale_all_dim"]))
    return get_mscale(factor)


def source_fields(cfg: dict) -> dict:
    """The numerics-relevant fields of a source HF config, in one normalized form."""
    c = text_config(cfg)
    theta, scaling = read_rope(c)
    heads = int(c["num_attention_heads"])
    window = c.get("sliding_window")
    if c.get("use_sliding_window") is False:  # Qwen2: transformers sets the window to None then
        window = None
    return {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": number(c.get("rms_norm_eps", c.get("layer_norm_epsilon"))),
        "hidden_act": c.get("hidden_act"),
        "head_size": int(c.get("head_dim") or int(c["hidden_size"]) // heads),
        "num_key_value_heads": int(c.get("num_key_value_heads") or heads),
        "vocab_size": int(c["vocab_size"]),
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "max_position_embeddings": c.get("max_position_embeddings"),
        "sliding_window": window,
    }


def hf_rope_4x(cfg: dict) -> dict:
    """The transformers 4.x spelling (rope_theta + rope_scaling) of an HF config's rope settings: the
    same parameters as `rope_parameters`, without rope_theta (null scaling for plain RoPE)."""
    theta, s = read_rope(cfg)
    scaling = None
    params = cfg.get("rope_parameters")
    if s["rope_type"] != "default":
        raw = params if isinstance(params, dict) and params else (cfg.get("rope_scaling") or {})
        scaling = {k: v for k, v in raw.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return {"rope_theta": theta, "rope_scaling": scaling}
