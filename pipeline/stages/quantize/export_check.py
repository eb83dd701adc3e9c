"""Export cross-check: every field of the source HF config that changes numerics must mean the same in
each export LPX writes, before the quantize stage commits.

Why: ModelOpt 0.47's TensorRT-LLM export reads `config.rope_theta` and `config.rope_scaling` the way
transformers 4.x kept them; transformers 5 keeps both in `config.rope_parameters`, so the exported
config.json has no `rotary_base` / `rotary_scaling` and TensorRT-LLM silently falls back to base 10000
without scaling (wrong outputs for Llama-3.x, Qwen2.5, Mistral).

Source side: HF config.json in both styles, normalized by source_config.py.

TensorRT-LLM side, names as TensorRT-LLM defines them (read 2026-12-03 from NVIDIA/TensorRT-LLM):
  tensorrt_llm/models/modeling_utils.py  PretrainedConfig: vocab_size, hidden_act, norm_epsilon,
      max_position_embeddings, num_key_value_heads (None -> num_attention_heads), head_size
      (None -> hidden_size // num_attention_heads); `tie_word_embeddings` passed as an extra key
  tensorrt_llm/models/llama/config.py (LLaMAConfig, commit 89fd9b74ab7a, the 1.2 line) and
  tensorrt_llm/models/qwen/config.py (QWenConfig): rotary_base (default 10000.0) <- rope_theta,
      rotary_scaling (default None) <- the HF 4.x `rope_scaling` dict as is
  tensorrt_llm/layers/attention.py Attention.create_attention_const_params: the scaling type is
      rotary_scaling["type"] or ["rope_type"] (RotaryScalingType.from_string in tensorrt_llm/functional.py:
      none, linear, dynamic, longrope, llama3, yarn, mrope; "default" means none from the 1.2 line on),
      factor (default 1.0); yarn reads beta_fast (32), beta_slow (1), mscale (1.0), mscale_all_dim (0.0)
      and original_max_position_embeddings (default 4096, not the model's!); llama3 reads low_freq_factor,
      high_freq_factor and original_max_position_embeddings; LongRoPE needs position_embedding_type
      long_rope and Phi-3's longrope_scaling_* keys, which LLaMAConfig / QWenConfig never set
  ModelOpt's own keys in the same file (modelopt/torch/export/tensorrt_llm_utils.py, 0.47):
      rotary_pct (<- partial_rotary_factor), share_embedding_table (tied lm_head)
  tests/contracts/trtllm_checkpoint.json holds the field list these names were checked against.

Rules: a field the export lacks is written when the mapping is certain, and the fix is recorded in the
manifest; a field present with another meaning is refused (LpxError naming the field, the
source value and the export's value). Sliding windows have no field in a TensorRT-LLM checkpoint: a
window at least build.max_seq_len long never truncates attention, a shorter one is refused before work
(`check_sliding_window`).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...atomic import write_atomic
from ...errors import LpxError, UsageError
from .source_config import (
    ROPE_TYPES,
    hf_rope_4x,
    number,
    read_rope,
    source_fields,
    text_config,
    yarn_attention_factor,
)

TRTLLM_YARN_DEFAULTS = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.0,
    "original_max_position_embeddings": 4096,
}
FIX = "re-export with a ModelOpt/transformers pair that writes it, or report it to LPX"


def trtllm_rotary_scaling(src: dict, where: str, found=None) -> dict | None:
    """The `rotary_scaling` TensorRT-LLM must read for the source scaling; refuses what has no certain mapping."""
    s = src["rope_scaling"]
    t = s["rope_type"]
    if t not in ROPE_TYPES:
        _refuse(
            where,
            "rotary_scaling",
            f"rope_type {t!r}",
            found,
            f"TensorRT-LLM's LLaMA/QWen configs know no "
            f"rope type {t!r} - use build.target torch, or a model with one of {', '.join(ROPE_TYPES)}",
        )
    if t == "default":
        return None
    if t == "longrope":
        _refuse(
            where,
            "rotary_scaling",
            f"rope_type longrope {_short(s)}",
            found,
            "TensorRT-LLM applies LongRoPE only through Phi-3's config (position_embedding_type long_rope and "
            "longrope_scaling_* keys), never for a LLaMA/QWen checkpoint - use build.target llmapi or torch",
        )
    out = {"type": t, "rope_type": t, "factor": float(s.get("factor", 1.0))}
    if t == "llama3":
        for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if s.get(k) is None:
                _refuse(where, "rotary_scaling", _short(s), found, f"llama3 scaling without {k}")
            out[k] = s[k]
    if t == "yarn":
        out.update(_trtllm_yarn(s, where, found))
    return out


def _trtllm_yarn(s: dict, where: str, found=None) -> dict:
    """The yarn keys of `rotary_scaling` (beyond type and factor); refuses yarn settings TensorRT-LLM would
    read differently from transformers."""
    if s.get("truncate") is False:
        _refuse(
            where,
            "rotary_scaling",
            _short(s),
            found,
            "yarn with truncate: false has no TensorRT-LLM equivalent (it always truncates the ramp)",
        )
    mscale, all_dim = s.get("mscale"), s.get("mscale_all_dim")
    if mscale and not all_dim and mscale != 1.0:
        _refuse(
            where,
            "rotary_scaling",
            _short(s),
            found,
            "yarn mscale without mscale_all_dim: transformers ignores it, TensorRT-LLM applies it",
        )
    if s.get("attention_factor") is not None and float(s["attention_factor"]) != yarn_attention_factor(s):
        _refuse(
            where,
            "rotary_scaling",
            _short(s),
            found,
            "yarn attention_factor differs from the one TensorRT-LLM derives from factor/mscale",
        )
    out = {
        "beta_fast": float(s["beta_fast"]),
        "beta_slow": float(s["beta_slow"]),
        "original_max_position_embeddings": int(s["original_max_position_embeddings"]),
    }
    if mscale and all_dim:
        out.update(mscale=float(mscale), mscale_all_dim=float(all_dim))
    return out


def _trtllm_scaling_meaning(value) -> dict | None:
    """What TensorRT-LLM makes of a `rotary_scaling` value (its defaults applied), for comparison."""
    if not value:
        return None
    t = value.get("type", value.get("rope_type"))
    if t in (None, "none", "default"):
        return None
    out = {"type": t, "factor": float(value.get("factor", 1.0))}
    if t == "yarn":
        out.update({k: float(value.get(k, d)) for k, d in TRTLLM_YARN_DEFAULTS.items()})
    elif t in ("llama3", "longrope"):
        for k in (
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
            "short_factor",
            "long_factor",
        ):
            if k in value:
                out[k] = number(value[k])
    return out


def _short(v) -> str:
    s = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else repr(v)
    return s if len(s) <= 160 else s[:157] + "..."


def _refuse(where: str, field: str, source, found, why: str) -> None:
    found_s = "no value" if found is None else _short(found)
    raise LpxError(
        f"{where}: {field}: the source config says {source if isinstance(source, str) else _short(source)}"
        f" but the export has {found_s} ({why})"
    )


def expected_trtllm(src: dict, where: str, found: dict) -> dict:
    """TensorRT-LLM checkpoint field -> value it must hold, from the source fields."""
    return {
        "rotary_base": src["rope_theta"],
        "rotary_scaling": trtllm_rotary_scaling(src, where, found.get("rotary_scaling")),
        "rotary_pct": float(src["rope_scaling"].get("partial_rotary_factor", 1.0)),
        "norm_epsilon": src["rms_norm_eps"],
        "hidden_act": src["hidden_act"],
        "head_size": src["head_size"],
        "num_key_value_heads": src["num_key_value_heads"],
        "vocab_size": src["vocab_size"],
        "max_position_embeddings": src["max_position_embeddings"],
    }


def _same_trtllm(field: str, want, got) -> bool:
    if field == "rotary_scaling":
        return _trtllm_scaling_meaning(want) == _trtllm_scaling_meaning(got)
    if isinstance(want, float) or isinstance(got, float):
        return got is not None and want is not None and float(want) == float(got)
    return want == got


def check_trtllm(source_config: dict, trtllm_dir: Path, where: str) -> list[str]:
    """Check (and complete) the TensorRT-LLM checkpoint's config.json against the source; returns the fixes."""
    path = Path(trtllm_dir) / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    src = source_fields(source_config)
    fixes: list[str] = []
    defaults = {
        "num_key_value_heads": cfg.get("num_attention_heads"),
        "head_size": (cfg["hidden_size"] // cfg["num_attention_heads"]) if "hidden_size" in cfg else None,
        "rotary_pct": 1.0,
    }
    for field, want in expected_trtllm(src, where, cfg).items():
        if field in cfg and cfg[field] is not None:
            got = cfg[field]
        elif field in defaults:  # absent means TensorRT-LLM's default, which may already be right
            got = defaults[field]
        else:
            got = None
        if field == "rotary_scaling" and field not in cfg:
            got = None
        if _same_trtllm(field, want, got):
            continue
        if field in cfg and cfg[field] is not None:
            _refuse(where, f"trtllm/config.json {field}", want, got, FIX)
        cfg[field] = want
        fixes.append(f"trtllm/config.json: wrote {field} = {_short(want)} (missing; from the source config)")
    _check_tied(src, cfg, Path(trtllm_dir), where)
    if fixes:
        write_atomic(path, json.dumps(cfg, indent=4) + "\n")
    return fixes


def _check_tied(src: dict, cfg: dict, trtllm_dir: Path, where: str) -> None:
    """A tied lm_head is the embedding: TensorRT-LLM either shares the table or carries lm_head.weight."""
    share = bool(cfg.get("share_embedding_table") or cfg.get("tie_word_embeddings"))
    if share and not src["tie_word_embeddings"]:
        _refuse(
            where,
            "trtllm/config.json share_embedding_table",
            "tie_word_embeddings false",
            share,
            "the model has its own lm_head; a shared table would drop it",
        )
    if not share:
        from safetensors import safe_open

        ranks = sorted(trtllm_dir.glob("rank*.safetensors"))
        has_head = False
        for r in ranks:
            with safe_open(str(r), "pt") as f:
                if any(k.startswith("lm_head.") for k in f.keys()):
                    has_head = True
                    break
        if ranks and not has_head:
            _refuse(
                where,
                "trtllm lm_head",
                f"tie_word_embeddings {src['tie_word_embeddings']}",
                "no lm_head.weight and share_embedding_table false",
                "the checkpoint has no output layer",
            )


def check_hf(source_config: dict, hf_dir: Path, where: str) -> list[str]:
    """Check the unified HF checkpoint's config.json against the source; write the transformers 4.x rope keys
    beside transformers 5's `rope_parameters` so either reader gets the same RoPE. Returns the fixes."""
    path = Path(hf_dir) / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    src, got = source_fields(source_config), source_fields(cfg)
    for field in (
        "rope_theta",
        "rope_scaling",
        "rms_norm_eps",
        "hidden_act",
        "head_size",
        "num_key_value_heads",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
        "sliding_window",
    ):
        if src[field] != got[field]:
            _refuse(where, f"hf/config.json {field}", src[field], got[field], FIX)
    fixes = []
    text = text_config(cfg)
    legacy = {k: text[k] for k in ("rope_theta", "rope_scaling", "max_position_embeddings") if k in text}
    theta, scaling = read_rope(text)
    old_theta, old_scaling = read_rope(legacy)
    scaling.pop("partial_rotary_factor", None)
    old_scaling.pop("partial_rotary_factor", None)
    if "rope_theta" in legacy and old_theta != theta:
        _refuse(
            where, "hf/config.json rope_theta", theta, legacy["rope_theta"], "rope_parameters says otherwise"
        )
    if "rope_scaling" in legacy and old_scaling != scaling:
        _refuse(
            where,
            "hf/config.json rope_scaling",
            scaling,
            legacy["rope_scaling"],
            "rope_parameters says otherwise",
        )
    for key, value in hf_rope_4x(text).items():
        if key not in text:
            text[key] = value
            fixes.append(f"hf/config.json: wrote {key} = {_short(value)} (transformers 4.x name)")
    if fixes:
        write_atomic(path, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return fixes


def check_sliding_window(source_config: dict, max_seq_len: int, where: str) -> None:
    """A window at least max_seq_len tokens long never truncates attention, so exports without one mean the
    same; a shorter one has no TensorRT-LLM checkpoint field and is refused before work."""
    window = source_fields(source_config)["sliding_window"]
    if window is not None and int(window) < max_seq_len:
        raise UsageError(
            f"{where}: sliding_window: the source config says {window} but a TensorRT-LLM checkpoint has no sliding "
            f"window field (absent: full attention up to build.max_seq_len {max_seq_len}) - set build.max_seq_len "
            f"<= {window}"
        )


def check_llmapi_options(source_config: dict, options: dict, where: str) -> None:
    """The LLM-API options LPX writes carry no model fields (the LLM API reads config.json); check the ones
    that bound numerics: the sequence length against the positions and the window."""
    src = source_fields(source_config)
    limit = src["max_position_embeddings"]
    if limit and options.get("max_seq_len", 0) > int(limit):
        raise UsageError(
            f"{where}: llm_api_options max_seq_len {options['max_seq_len']} but the checkpoint's "
            f"max_position_embeddings is {limit} - lower build.max_seq_len"
        )
    check_sliding_window(source_config, int(options.get("max_seq_len", 0)), where)
    overrides = sorted(
        k for k in options if k in src or k in ("rope_theta", "rope_scaling", "rope_parameters")
    )
    if overrides:
        raise LpxError(
            f"{where}: llm_api_options would override model fields {', '.join(overrides)} - "
            "LPX writes none; remove them"
        )
