"""Structured outputs (LPX issue 27, item 1): response_format json_object / json_schema and vLLM's
structured_outputs (json, regex, choice, grammar), enforced token by token by the torch engine's grammar
processor (xgrammar). Over the official `openai` SDK to a real gateway on the session's real tritonserver
serving the demo's tiny random model: if the answers are valid, the grammar did it.

The unit part checks what is refused (a bad schema / regex / grammar, two guides at once, a target
that cannot enforce one - against the contracts' tensors and parameters) without a server.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers_schemas import assert_schema_answers, schemas

from pipeline.gateway.errors import ApiError
from pipeline.gateway.structured import Guide, choice_grammar, engine_values, from_structured_outputs
from pipeline.gateway.structured import from_response_format as rf_guide

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

MODEL = "tiny-llama"
USER = [{"role": "user", "content": "Answer in JSON."}]
MAX_TOKENS = 400  # every generated schema's longest answer fits well below this (bounded strings, arrays)


# -- unit: what is refused, without a server ----------------------------------------------------------
@pytest.mark.parametrize(
    "so, words",
    [
        ({"json": {"type": "bogus"}}, "Unsupported type"),
        ({"regex": "("}, "parenthesis"),
        ({"grammar": "root ::= undefined_rule"}, "not defined"),
        ({"json": {"type": "object"}, "regex": "a"}, "exactly one"),
        ({"choice": []}, "non-empty strings"),
        ({"structural_tag": {"x": 1}}, "not supported"),
        ({"jsn": {}}, "unknown fields"),
    ],
)
def test_bad_guides_are_400_naming_the_field(so, words) -> None:
    with pytest.raises(ApiError) as err:
        from_structured_outputs(so)
    assert err.value.status == 400 and words in err.value.message
    assert (err.value.param or "").startswith("structured_outputs")


def test_response_format_shapes() -> None:
    assert rf_guide({"type": "text"}) is None
    assert rf_guide({"type": "json_object"}).type == "json"
    g = rf_guide(
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "integer"}, "strict": True}}
    )
    assert (g.type, json.loads(g.text)) == ("json_schema", {"type": "integer"})
    with pytest.raises(ApiError, match="json_schema needs"):
        rf_guide({"type": "json_schema", "json_schema": {"name": "a"}})


def test_choice_grammar_escapes_its_strings() -> None:
    import xgrammar

    text = choice_grammar(['say "hi"', "back\\slash", "日本"], "c")
    xgrammar.Grammar.from_ebnf(text)  # parses
    assert '"say \\"hi\\""' in text


def test_targets_that_cannot_enforce_are_400_naming_the_fix() -> None:
    """Against the contracts: the 0.16 line's tensorrt_llm declares no guide input; the engine target's
    C++ model needs guided_decoding_backend + xgrammar_tokenizer_info_path (the parameters upstream's
    template names); LPX's python models (latest tensors) take the guide."""
    from pipeline.gateway.triton import ModelInfo
    from pipeline.runtime.upstream_trtllm import TRTLLM_IO

    guide = Guide("regex", "a+", "structured_outputs.regex")
    inputs = lambda v: {row[0]: "BYTES" for row in TRTLLM_IO[v]["in"]}  # noqa: E731
    old = ModelInfo(inputs("v0.16.0"), set())
    with pytest.raises(ApiError, match="TensorRT-LLM 0.16"):
        engine_values(guide, old)
    engine = ModelInfo(inputs("latest"), set(), params={"tensorrt_llm": {"executor_worker_path": "/opt/x"}})
    with pytest.raises(ApiError, match="guided_decoding_backend parameter to xgrammar") as err:
        engine_values(guide, engine)
    assert "`engine` target" in err.value.message
    engine.params["tensorrt_llm"] |= {
        "guided_decoding_backend": "xgrammar",
        "xgrammar_tokenizer_info_path": "/x.json",
    }
    assert engine_values(guide, engine)["guided_decoding_guide"] == "a+"
    torch = ModelInfo(
        inputs("latest"), set(), params={"tensorrt_llm": {"gpt_model_type": "inflight_fused_batching"}}
    )
    assert engine_values(guide, torch)["guided_decoding_guide_type"] == "regex"


# -- the grammar itself, on the demo's tokenizer ---------------------------------------------------------
@pytest.fixture(scope="module")
def demo_grammars(torch_engine_dir):
    from transformers import AutoTokenizer

    from pipeline.runtime.engines.grammar import Grammars

    tok = AutoTokenizer.from_pretrained(torch_engine_dir)
    return tok, Grammars(tok, len(tok), [tok.eos_token_id])


def _accepts(grammars, compiled, ids: list[int]) -> int:
    """How many of `ids` a fresh matcher of `compiled` accepts in a row."""
    matcher = grammars.xgr.GrammarMatcher(compiled)
    for at, token in enumerate(ids):
        if not matcher.accept_token(int(token)):
            return at
    return len(ids)


def test_length_bounded_strings_take_no_control_bytes(demo_grammars) -> None:
    """xgrammar 0.2.9's rule for a string with minLength / maxLength lets raw control bytes through (the
    20-schema test once got '"note": "你\\x01y and"', invalid JSON) and takes no escapes; LPX's grammar
    (grammar.schema_ebnf) takes JSON string characters there."""
    tok, grammars = demo_grammars
    bounded = grammars.compile("json_schema", json.dumps(schemas()[16]))
    answer = '{"ok": "red", "tags": "red", "note": "你\x01y and", "items": {"name": false}}'
    ids = tok.encode(answer, add_special_tokens=False)
    cut = tok.encode('{"ok": "red", "tags": "red", "note": "你', add_special_tokens=False)
    assert _accepts(grammars, bounded, ids) == len(cut)  # the control byte is refused, nothing before it
    short = grammars.compile("json_schema", json.dumps({"type": "string", "minLength": 2, "maxLength": 4}))
    for text in ('"a\\"b"', '"\\u00e9x"', '"ab"'):
        matcher = grammars.xgr.GrammarMatcher(short)
        assert all(matcher.accept_token(t) for t in tok.encode(text, add_special_tokens=False)), text
        assert matcher.accept_token(tok.eos_token_id), text
    for text in ('"a"', '"a\tb"', '"ab\x1f"', '"a\nb"'):
        ids = tok.encode(text, add_special_tokens=False)
        assert _accepts(grammars, short, ids) < len(ids), text


# -- end to end: the openai SDK on a real gateway + tritonserver (torch target) -------------------------
@pytest.fixture(scope="module")
def client(torch_triton, tmp_path_factory):
    from helpers_engine import session_gateway

    for proc in session_gateway(torch_triton, tmp_path_factory.mktemp("structured"), MODEL):
        yield openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=USER, max_tokens=MAX_TOKENS, **kw)


@pytest.mark.triton
@pytest.mark.slow
def test_twenty_generated_schemas_are_answered_valid(client) -> None:
    assert_schema_answers(client, MODEL, MAX_TOKENS)


@pytest.mark.triton
@pytest.mark.slow
def test_json_object_regex_choice_and_grammar(client) -> None:
    obj = _chat(client, response_format={"type": "json_object"}, temperature=0)
    if obj.choices[0].finish_reason == "stop":  # unbounded JSON may run to max_tokens; when whole, it parses
        json.loads(obj.choices[0].message.content)
    regex = r"[a-z]{2,5}-\d{1,3}"
    r = _chat(client, extra_body={"structured_outputs": {"regex": regex}}, temperature=1.0)
    assert re.fullmatch(regex, r.choices[0].message.content), r.choices[0].message.content
    choices = ["positive", "negative", "not sure"]
    for t in (0, 1.0):
        c = _chat(client, extra_body={"structured_outputs": {"choice": choices}}, temperature=t)
        assert c.choices[0].message.content in choices
    comp = client.completions.create(
        model=MODEL,
        prompt="Pick:",
        max_tokens=20,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert comp.choices[0].text in ("yes", "no")
    g = _chat(client, extra_body={"structured_outputs": {"grammar": 'root ::= "(" [0-9] ("+" [0-9])* ")"'}})
    assert re.fullmatch(r"\(\d(\+\d)*\)", g.choices[0].message.content)


@pytest.mark.triton
@pytest.mark.slow
def test_streamed_schema_answer_adds_up_and_is_valid(client) -> None:
    schema = schemas(1, seed=99)[0]
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    stream = _chat(client, response_format=rf, stream=True, temperature=1.0)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.triton
@pytest.mark.slow
def test_bad_guides_are_400_over_http(client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, extra_body={"structured_outputs": {"regex": "(unclosed"}})
    assert err.value.body["param"] == "structured_outputs.regex"
    with pytest.raises(openai.BadRequestError, match="send one of them"):
        _chat(
            client, response_format={"type": "json_object"}, extra_body={"structured_outputs": {"regex": "a"}}
        )
    with pytest.raises(openai.BadRequestError, match="leave ignore_eos out") as err:
        _chat(client, response_format={"type": "json_object"}, extra_body={"ignore_eos": True})
    assert err.value.body["param"] == "ignore_eos"


# -- in process: guided requests side by side in the torch engine's batch ---------------------------------
def test_concurrent_guided_requests_keep_their_own_grammar(torch_engine, demo_grammars) -> None:
    """Twelve guided requests (different schemas, sampled, seeded) share the engine's batch (8 rows, so
    some join mid-run): replayed through a fresh matcher of its own grammar every request's tokens are all
    accepted (no mask lands on another request's row) and each answer is valid against its schema."""
    from pipeline.runtime.engines.base import Request

    tok, grammars = demo_grammars
    prompt = tok.encode("Answer in JSON:", add_special_tokens=False)
    jobs = []
    for i, schema in enumerate(schemas(12, seed=5)):
        options = {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(schema)}
        request = Request(prompt, MAX_TOKENS, None, 1.0, 0, 1.0, i, options)
        jobs.append((schema, torch_engine.start(request)))
    for schema, stream in jobs:
        ids = [t for delta in stream for t in delta]
        assert ids and ids[-1] == tok.eos_token_id, tok.decode(ids)
        compiled = grammars.compile("json_schema", json.dumps(schema))
        assert _accepts(grammars, compiled, ids) == len(ids), tok.decode(ids)
        jsonschema.validate(json.loads(tok.decode(ids[:-1])), schema)


def test_a_desync_is_reported_and_min_tokens_with_a_guide_is_refused(torch_engine, demo_grammars) -> None:
    """A token the grammar did not allow is named (the engine ends that request with an error) instead of
    being skipped; min_tokens with a guide is refused: once the answer is whole the grammar allows only
    the end id, which min_tokens forbids (every score would be -inf)."""
    from pipeline.errors import LpxError
    from pipeline.runtime.engines.base import Request
    from pipeline.runtime.engines.grammar import _advance

    tok, grammars = demo_grammars
    compiled = grammars.compile("json_schema", json.dumps({"type": "boolean"}))
    entry = [grammars.xgr.GrammarMatcher(compiled), 0]
    ids = tok.encode("true", add_special_tokens=False)
    assert _advance(entry, ids) is None and entry[1] == len(ids)
    problem = _advance(entry, [*ids, tok.eos_token_id, ids[0]])
    assert problem is not None and "after the grammar ended" in problem and entry[1] == len(ids) + 2
    entry = [grammars.xgr.GrammarMatcher(compiled), 0]
    assert "forbids" in (_advance(entry, tok.encode('"x"', add_special_tokens=False)) or "")
    options = {"guided_decoding_guide_type": "json", "guided_decoding_guide": "", "min_tokens": 4}
    with pytest.raises(LpxError, match="min_tokens cannot be combined with guided decoding"):
        torch_engine.start(
            Request(tok.encode("x", add_special_tokens=False), 8, None, 1.0, 0, 1.0, 1, options)
        )
