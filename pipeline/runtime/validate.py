"""One validation layer for the sampling and length inputs of a generation request.

Every entry point runs it before any work: the preprocessing model (so the ensemble and the BLS model,
whose requests pass through it, refuse before the engine is called, whatever the target), and LPX's own
`tensorrt_llm` python models (direct calls on the `torch` and `llmapi` targets). The rules are
TensorRT-LLM's (executor SamplingConfig's checks, and the backend's reading of the request tensors):
top_p in [0, 1] where 0 means "no top-p" (the backend drops a top_p <= 0); temperature finite and >= 0
(0: greedy); top_k >= 0 (0: no top-k); repetition_penalty > 0; min_tokens >= 0; beam_width and
num_return_sequences >= 1. LPX adds what TensorRT-LLM leaves to chance: NaN and infinity refused,
end_id / pad_id inside the vocabulary, min_tokens at most max_tokens, seeds inside uint64, and a
max_tokens of 0 or below explained (Triton's HTTP generate endpoint converts a JSON number to the
input's INT32 before a model sees it, so 2**40 arrives as 0 and 2**31 as -2**31).

A value a target cannot honour (beam search on `torch`, LoRA, prompt tables, guided decoding,
logits outputs) is refused naming the input, the target and the fix - only when it differs from the
input's default, so clients written for upstream's ensemble work unchanged.

Each input is known under its ensemble / BLS name and its `tensorrt_llm` name (top_p and runtime_top_p);
messages use the name the client sent. The length limits (max_input_len, max_seq_len, max_tokens_cap,
min_tokens <= max_tokens) are checked by limits.py's functions, the ones the OpenAI gateway asks too, so
each limit has one check and one message. Pure Python: no Triton import, so tests call it directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .limits import Limits, max_tokens_refusal, min_tokens_refusal
from .limits import show as _show

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1


class RequestError(ValueError):
    """A malformed or unsupported request: the models answer it as Triton's INVALID_ARG (HTTP 400)."""


# tensorrt_llm input name -> the ensemble / BLS name of the same value (v0.16 names included)
ENGINE_NAMES = {
    "request_output_len": "max_tokens",
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "len_penalty": "length_penalty",
    "min_length": "min_tokens",
    "random_seed": "seed",
    "streaming": "stream",
    "prompt_table_extra_ids": "prompt_table_extra_id",
}

# Inputs that change what is computed; a target honours the ones in Limits.supported, and any other
# is accepted only at its default (absent, empty, or the value below). The beam-search knobs
# (length_penalty, early_stopping, beam_search_diversity_rate) are not here: with beam_width 1 they
# change nothing, and TensorRT-LLM accepts them then too.
FEATURE_DEFAULTS: dict[str, Any] = {
    "beam_width": 1,
    "num_return_sequences": 1,
    "runtime_top_p_min": None,
    "runtime_top_p_decay": None,
    "runtime_top_p_reset_ids": None,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
    "return_log_probs": False,
    "top_log_probs_k": 0,  # LPX's extension (tensors.LPX_TRTLLM): alternatives per token
    "return_context_logits": False,
    "return_generation_logits": False,
    "return_perf_metrics": False,
    "return_num_input_tokens": False,
    "return_kv_cache_reuse_stats": False,
    "embedding_bias_words": None,
    "embedding_bias_weights": None,
    "embedding_bias": None,
    "prompt_embedding_table": None,
    "prompt_vocab_size": None,
    "prompt_table_extra_id": None,
    "lora_task_id": None,
    "lora_weights": None,
    "lora_config": None,
    "guided_decoding_guide_type": None,
    "guided_decoding_guide": None,
    "decoder_text_input": None,
    "decoder_input_ids": None,
    "image_input": None,
    "image_bytes_input": None,
    "image_url_input": None,
    "image_sizes_input": None,
    "video_bytes_input": None,
    "num_draft_tokens": 0,
    "use_draft_logits": False,
    "draft_input_ids": None,
    "draft_logits": None,
    "encoder_input_features": None,
    "cross_attention_mask": None,
}
FIXES = {  # what to do instead, per feature a target may lack
    "beam_width": "send beam_width 1 (sampling or greedy): LPX serves without beam search",
    "num_return_sequences": "send num_return_sequences 1, or send the request that many times with different seeds",
    "lora_task_id": "leave out the LoRA inputs: LPX serves the base model without adapters",
    "lora_weights": "leave out the LoRA inputs: LPX serves the base model without adapters",
    "lora_config": "leave out the LoRA inputs: LPX serves the base model without adapters",
    "prompt_embedding_table": "leave out the prompt-tuning inputs: LPX serves text-only models",
    "guided_decoding_guide_type": "leave out guided decoding (structured outputs, required tool calls), or serve the torch, llmapi or vllm target, which enforce it",
    "guided_decoding_guide": "leave out guided decoding (structured outputs, required tool calls), or serve the torch, llmapi or vllm target, which enforce it",
    "decoder_text_input": "send the prompt as text_input: LPX serves decoder-only models",
    "top_log_probs_k": "send 0: this target returns only the sampled token's log prob (serve the torch, "
    "llmapi or vllm target for alternatives)",
    "return_context_logits": "leave it false: this target does not return logits (use `lpx eval` for quality)",
    "return_generation_logits": "leave it false: this target does not return logits (use `lpx eval` for quality)",
}


ALL_FEATURES = frozenset(FEATURE_DEFAULTS)


def canonical(name: str) -> str:
    return ENGINE_NAMES.get(name, name)


def _scalar(value: Any) -> Any:
    """A request tensor's first element as a Python value (numpy arrays, lists and scalars alike)."""
    if value is None:
        return None
    if hasattr(value, "reshape"):
        flat = value.reshape(-1)
        if flat.size == 0:
            return None
        value = flat[0]
        return value.item() if hasattr(value, "item") else value
    if isinstance(value, (list, tuple)):
        return _scalar(value[0]) if value else None
    return value


def _flat(value: Any) -> list:
    return list(value.reshape(-1)) if hasattr(value, "reshape") else list(value)


def _is_default(name: str, value: Any) -> bool:
    if value is None:
        return True
    if hasattr(value, "size") and getattr(value, "ndim", 0) > 0:
        if value.size == 0:
            return True
        if value.dtype.kind in "OSU":  # strings: empty ones are the default
            return all(not (v.decode() if isinstance(v, bytes) else str(v)) for v in value.reshape(-1))
        if value.size > 1:
            return False
    v = _scalar(value)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    default = FEATURE_DEFAULTS.get(name)
    if isinstance(v, str):
        return v == ""
    if default is None:
        return False
    if isinstance(default, bool) or isinstance(v, bool):
        return bool(v) == bool(default)
    return float(v) == float(default)


def _number(sent: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RequestError(f"{sent} must be a number (got {value!r}) - send it as a number") from None


def _finite(sent: str, value: Any) -> float:
    v = _number(sent, value)
    if not math.isfinite(v):
        raise RequestError(f"{sent} must be a finite number (got {value}) - send a real value")
    return v


def _integer(sent: str, value: Any) -> int:
    """An integer input read exactly (a float seed of 2**64 must not round into range)."""
    if isinstance(value, bool) or not isinstance(value, int):
        v = _finite(sent, value)
        if not v.is_integer():
            raise RequestError(f"{sent} must be a whole number (got {value}) - send an integer")
        return int(v)
    return value


def _range(sent: str, v: float, lo: float | None, hi: float | None, allowed: str, fix: str) -> None:
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise RequestError(f"{sent} {_show(v)} is out of range: allowed {allowed} - {fix}")


def _token_id(sent: str, value: Any, limits: Limits) -> None:
    v = _finite(sent, value)
    top = (limits.vocab_size - 1) if limits.vocab_size else None
    if v < 0 or (top is not None and v > top) or not float(v).is_integer():
        allowed = f"0..{top}" if top is not None else ">= 0"
        raise RequestError(
            f"{sent} {_show(v)} is not a token id of this model: allowed {allowed} - leave it out to use "
            "the tokenizer's, or send an id from the model's vocabulary"
        )


def check_max_tokens(sent: str, value: Any, limits: Limits, n_prompt: int | None = None) -> int:
    v = _finite(sent, value)
    cap = limits.max_tokens_cap or INT32_MAX
    if v < 1:
        raise RequestError(
            f"{sent} must be between 1 and {cap} (got {_show(v)}) - ask for at least one token; a JSON "
            f"number above {INT32_MAX} sent to Triton's HTTP generate endpoint arrives wrapped to INT32 "
            "(2**40 as 0): send at most the cap"
        )
    if v > INT32_MAX:
        raise RequestError(f"{sent} {_show(v)} is too large: at most {cap} (INT32) - ask for fewer tokens")
    if refusal := max_tokens_refusal(sent, v, limits, n_prompt):
        raise RequestError(refusal.message)
    return int(v)


MAX_TOP_LOG_PROBS = 20  # top_log_probs_k: OpenAI's top_logprobs bound


def check(values: Mapping[str, Any], limits: Limits, n_prompt: int | None = None) -> None:
    """Refuse the first bad input of one request with a RequestError. `values`: input name (ensemble or
    tensorrt_llm spelling) -> the sent tensor or value; absent inputs may be missing or None."""
    given = {name: value for name, value in values.items() if value is not None}
    by_canon = {canonical(name): (name, value) for name, value in given.items()}

    def get(canon: str):
        sent, value = by_canon.get(canon, (canon, None))
        return sent, _scalar(value)

    sent, v = get("max_tokens")
    max_tokens = check_max_tokens(sent, v, limits, n_prompt) if v is not None else None
    _check_sampling(get, limits)
    _check_counts(get, limits, max_tokens)
    _check_bias(given)
    _check_supported(by_canon, limits)


def _check_sampling(get: Any, limits: Limits) -> None:
    """top_p, temperature, top_k and the penalties."""
    sent, v = get("top_p")
    if v is not None:
        _range(
            sent,
            _finite(sent, v),
            0.0,
            1.0,
            "0 < top_p <= 1, or 0 for no top-p (as TensorRT-LLM reads it)",
            "send a probability mass such as 0.9",
        )
    sent, v = get("temperature")
    if v is not None:
        _range(sent, _finite(sent, v), 0.0, None, ">= 0 (0: greedy)", "send 0 for greedy or e.g. 0.7")
    sent, v = get("top_k")
    if v is not None:
        k = _finite(sent, v)
        top = limits.vocab_size
        _range(sent, k, 0, top, f"0..{top} (0: no top-k)" if top else ">= 0 (0: no top-k)", "send e.g. 50")
    sent, v = get("repetition_penalty")
    if v is not None:
        p = _finite(sent, v)
        if p <= 0:
            raise RequestError(f"{sent} {_show(p)} is out of range: allowed > 0 (1: off) - send e.g. 1.1")
    for canon in ("presence_penalty", "frequency_penalty", "length_penalty", "beam_search_diversity_rate"):
        sent, v = get(canon)
        if v is not None:
            x = _finite(sent, v)
            if canon == "beam_search_diversity_rate" and x < 0:
                raise RequestError(f"{sent} {_show(x)} is out of range: allowed >= 0 - send 0")


def _check_counts(get: Any, limits: Limits, max_tokens: int | None) -> None:
    """min_tokens, beams, returned sequences, top_log_probs_k, the seed and the end / pad ids."""
    sent, v = get("min_tokens")
    if v is not None:
        m = _finite(sent, v)
        _range(sent, m, 0, INT32_MAX, ">= 0", "send 0 (no minimum) or a count up to max_tokens")
        if max_tokens is not None and (refusal := min_tokens_refusal(sent, m, max_tokens)):
            raise RequestError(refusal.message)
    for canon in ("beam_width", "num_return_sequences"):
        sent, v = get(canon)
        if v is not None:
            n = _finite(sent, v)
            _range(sent, n, 1, None, ">= 1", f"send {canon} 1")
            if canon == "beam_width" and limits.max_beam_width and n > limits.max_beam_width:
                raise RequestError(
                    f"{sent} {_show(n)} is above the engine's max_beam_width {limits.max_beam_width} - "
                    f"send beam_width <= {limits.max_beam_width}"
                )
    sent, v = get("top_log_probs_k")
    if v is not None:
        k = _integer(sent, v)
        _range(sent, k, 0, MAX_TOP_LOG_PROBS, f"0..{MAX_TOP_LOG_PROBS}", "send at most 20 alternatives")
    sent, v = get("seed")
    if v is not None:
        seed = _integer(sent, v)
        if not 0 <= seed <= UINT64_MAX:
            raise RequestError(
                f"{sent} {seed} is out of range: allowed 0..{UINT64_MAX} - send a non-negative seed"
            )
    for canon in ("end_id", "pad_id"):
        sent, v = get(canon)
        if v is not None:
            _token_id(sent, v, limits)


def _check_bias(given: dict[str, Any]) -> None:
    """embedding_bias_words and _weights: both or neither, one weight per word, finite."""
    words, weights = given.get("embedding_bias_words"), given.get("embedding_bias_weights")
    if words is not None or weights is not None:
        n_words = (
            0
            if words is None
            else sum(1 for w in _flat(words) if (w.decode() if isinstance(w, bytes) else w))
        )
        n_weights = 0 if weights is None else len(_flat(weights))
        if n_words != n_weights:
            raise RequestError(
                f"embedding_bias_words has {n_words} entries and embedding_bias_weights {n_weights} - "
                "send one weight per word"
            )
        for w in [] if weights is None else _flat(weights):
            _finite("embedding_bias_weights", w)


def _check_supported(by_canon: dict[str, tuple[str, Any]], limits: Limits) -> None:
    """What the target honours: a valid but unsupported non-default value is refused."""
    for canon, (sent, value) in by_canon.items():
        if canon in FEATURE_DEFAULTS and canon not in limits.supported and not _is_default(canon, value):
            shown = _scalar(value)
            shown = shown.decode("utf-8", "replace") if isinstance(shown, bytes) else shown
            raise RequestError(
                f"{sent} = {shown!r} is not supported by the `{limits.target}` target - "
                + FIXES.get(canon, f"leave {sent} out (or at its default)")
            )
