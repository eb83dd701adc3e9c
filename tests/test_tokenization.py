"""Preprocessing's request checks, chat template and end-of-sequence ids, with the models' own
functions (no server needed)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
from helpers_models import load_model_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pre() -> types.ModuleType:
    return load_model_module("preprocessing")


@pytest.fixture(scope="module")
def tokenizer():
    from pipeline.demo import _train_tokenizer, corpus_text, paragraphs

    return _train_tokenizer(paragraphs(corpus_text()), vocab_size=512)


def test_text_input_checks(pre) -> None:
    assert pre.first_text(np.array([["héllo".encode()]], dtype=object)) == "héllo"
    with pytest.raises(ValueError, match=r"text_input is not valid UTF-8 \(byte 0xff at offset 3\)"):
        pre.first_text(np.array([[b"ok \xff"]], dtype=object))
    for empty in (b"", b"  \n"):
        with pytest.raises(ValueError, match="text_input is empty - send a non-empty prompt"):
            pre.first_text(np.array([[empty]], dtype=object))
    with pytest.raises(ValueError, match="text_input is missing"):
        pre.first_text(None)


@pytest.mark.parametrize(
    ("n_prompt", "max_tokens", "message"),
    [
        (10, 0, r"max_tokens must be between 1 and 512 \(got 0\)"),
        (10, -5, r"max_tokens must be between 1 and 512 \(got -5\)"),
        (10, 513, r"max_tokens 513 is above this server's cap 512 - .*serving.max_tokens_cap"),
        (600, 8, r"The prompt has 600 tokens, above the engine's max_input_len 512 - shorten it"),
    ],
)
def test_length_checks(pre, n_prompt: int, max_tokens: int, message: str) -> None:
    """The preprocessing model refuses lengths with runtime/limits' one check per limit (the prompt first,
    then validate.check), as the gateway and the tensorrt_llm model do."""
    from pipeline.runtime.limits import Limits, input_refusal

    def refuse(n: int, m: int, limits: Limits) -> None:
        if refusal := pre.input_refusal(n, limits):
            raise pre.RequestError(refusal.message)
        pre.check({"max_tokens": np.array([[m]], dtype=np.int32)}, limits, n_prompt=n)

    assert pre.input_refusal is input_refusal and not hasattr(pre, "check_lengths")
    with pytest.raises(ValueError, match=message):
        refuse(n_prompt, max_tokens, Limits(max_input_len=512, max_tokens_cap=512))
    refuse(512, 512, Limits(max_input_len=512, max_tokens_cap=512))  # the limits themselves are allowed
    refuse(5000, 5000, Limits())  # 0: no limit configured


def test_every_end_id_of_generation_config(pre, tokenizer, tmp_path: Path) -> None:
    eos = tokenizer.eos_token_id
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 7, 9]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 11}))
    assert pre.end_ids(tmp_path, tokenizer) == [eos, 7, 9, 11]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert pre.end_ids(tmp_path, tokenizer) == [5, 11, eos]
    engine = load_model_module("torch_engine")
    assert engine.eos_ids(tmp_path) == [5]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 4]}))
    assert engine.eos_ids(tmp_path) == [3, 4], "the torch engine passes the whole list as end_ids"


def test_extra_end_ids_become_one_token_stop_words(pre, tokenizer) -> None:
    empty = pre.word_list(tokenizer, None)
    assert pre.with_stops(empty, []) is empty
    assert pre.with_stops(empty, [7, 9]).tolist() == [[[7, 9], [1, 2]]]
    words = pre.word_list(tokenizer, np.array([[b"river", b"stone"]], dtype=object))
    n = len(tokenizer.encode("river", add_special_tokens=False)) + len(
        tokenizer.encode("stone", add_special_tokens=False)
    )
    got = pre.with_stops(words, [7])
    assert got[0][0].tolist() == words[0][0][:n].tolist() + [7]
    ends = [e for e in got[0][1].tolist() if e >= 0]
    assert ends[-1] == n + 1 and ends[:-1] == [e for e in words[0][1].tolist() if e >= 0]


def test_chat_template_wraps_the_prompt(pre, tokenizer) -> None:
    plain = pre.prompt_ids(tokenizer, "the river", True, chat=False)
    assert plain == tokenizer.encode("the river", add_special_tokens=True)
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|> {{ m.content }}\n{% endfor %}<|assistant|>"
    )
    ids = pre.prompt_ids(tokenizer, "the river", True, chat=True)
    assert tokenizer.decode(ids) == "<|user|> the river\n<|assistant|>"
