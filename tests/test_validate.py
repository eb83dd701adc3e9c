"""The request validation layer on its own (pipeline/runtime/validate.py): every malformed value is
refused naming what was sent, and upstream's defaults always pass."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.runtime.validate import FEATURE_DEFAULTS, Limits, RequestError, check

LIMITS = Limits(vocab_size=32000, max_input_len=512, max_seq_len=1024, max_tokens_cap=512, target="torch")

# (inputs, a fragment the message must contain)
BAD = [
    ({"top_p": 2.0}, "top_p 2"),
    ({"top_p": -1.0}, "top_p -1"),
    ({"top_p": float("nan")}, "finite"),
    ({"runtime_top_p": 1.5}, "runtime_top_p"),
    ({"temperature": -1.0}, "temperature -1"),
    ({"temperature": float("nan")}, "finite"),
    ({"temperature": float("inf")}, "finite"),
    ({"top_k": -5}, "top_k -5"),
    ({"runtime_top_k": 40000}, "0..32000"),
    ({"end_id": 99999999}, "end_id 99999999"),
    ({"end_id": -2}, "not a token id"),
    ({"pad_id": -3}, "pad_id -3"),
    ({"pad_id": 32000}, "0..31999"),
    ({"max_tokens": 0}, "wrapped"),
    ({"max_tokens": -2147483648}, "between 1 and"),
    ({"max_tokens": 2**40}, "too large"),
    ({"max_tokens": 513}, "cap 512"),
    ({"request_output_len": 600}, "request_output_len 600"),
    ({"repetition_penalty": 0.0}, "> 0"),
    ({"repetition_penalty": -1.0}, "repetition_penalty -1"),
    ({"repetition_penalty": float("nan")}, "finite"),
    ({"presence_penalty": float("inf")}, "finite"),
    ({"frequency_penalty": float("nan")}, "finite"),
    ({"min_tokens": -1}, "min_tokens -1"),
    ({"max_tokens": 10, "min_tokens": 50}, "above max_tokens 10"),
    ({"seed": -1}, "seed -1"),
    ({"seed": 2**64}, "out of range"),
    ({"beam_width": 4}, "`torch` target"),
    ({"beam_width": 0}, "allowed >= 1"),
    ({"num_return_sequences": 3}, "num_return_sequences"),
    ({"lora_task_id": 7}, "LoRA"),
    ({"prompt_embedding_table": np.ones((2, 8), np.float16)}, "prompt-tuning"),
    ({"guided_decoding_guide_type": np.array([b"json"], dtype=object)}, "guided decoding"),
    ({"return_context_logits": True}, "logits"),
    ({"decoder_text_input": np.array([b"hello"], dtype=object)}, "decoder-only"),
    ({"embedding_bias_words": np.array([b"a", b"b"], dtype=object)}, "one weight per word"),
    (
        {
            "embedding_bias_words": np.array([b"a"], dtype=object),
            "embedding_bias_weights": np.array([2.0], np.float32),
        },
        "`torch` target",
    ),
    (
        {"embedding_bias_words": np.array([b"a"], dtype=object), "embedding_bias_weights": [float("nan")]},
        "finite",
    ),
    ({"temperature": "hot"}, "must be a number"),
]


@pytest.mark.parametrize(("inputs", "fragment"), BAD, ids=[repr(b[0])[:60] for b in BAD])
def test_malformed_inputs_are_refused_naming_the_value(inputs, fragment):
    with pytest.raises(RequestError) as err:
        check(inputs, LIMITS)
    assert fragment in str(err.value), str(err.value)
    assert " - " in str(err.value), "every message names a fix after ' - '"


def test_prompt_plus_max_tokens_above_max_seq_len_names_what_fits():
    with pytest.raises(RequestError, match="at most 24 tokens"):
        check({"max_tokens": 500}, LIMITS, n_prompt=1000)


def test_upstream_defaults_always_pass():
    """A client written for upstream's ensemble sends every optional input at its default."""
    defaults = {name: value for name, value in FEATURE_DEFAULTS.items() if value is not None}
    defaults.update(
        max_tokens=16,
        top_k=0,
        top_p=0.0,
        temperature=1.0,
        seed=0,
        end_id=2,
        pad_id=0,
        embedding_bias_words=np.array([b""], dtype=object),
        embedding_bias_weights=np.zeros((0,), np.float32),
        guided_decoding_guide_type=np.array([b""], dtype=object),
        prompt_embedding_table=np.zeros((0, 0), np.float16),
    )
    check(defaults, LIMITS)  # no error
    check({name: np.array([v]) for name, v in defaults.items() if not hasattr(v, "shape")}, LIMITS)


def test_boundaries_pass():
    check({"top_p": 1.0, "top_k": 32000, "temperature": 0.0, "end_id": 31999, "seed": 2**64 - 1}, LIMITS)
    check(
        {"max_tokens": 512, "min_tokens": 512},
        Limits(max_tokens_cap=512, supported=frozenset({"min_tokens"})),
    )


def test_a_target_that_honours_a_feature_accepts_it():
    engine = Limits(
        vocab_size=32000, max_beam_width=4, target="engine", supported=frozenset(FEATURE_DEFAULTS)
    )
    check({"beam_width": 4, "return_context_logits": True, "repetition_penalty": 1.3}, engine)
    with pytest.raises(RequestError, match="max_beam_width 4"):
        check({"beam_width": 8}, engine)


def test_lpx_client_refuses_a_max_tokens_int32_cannot_carry():
    from pipeline.client import _inputs
    from pipeline.errors import LpxError

    with pytest.raises(LpxError, match="max_tokens 1099511627776 cannot be sent"):
        _inputs("ensemble", "hi", 2**40, {})
    assert _inputs("ensemble", "hi", 2**31 - 1, {})["max_tokens"] == ("INT32", 2**31 - 1)
