"""Structured outputs: `response_format` (json_object, json_schema) and vLLM's `structured_outputs`
extension (json, regex, choice, grammar, json_object) as one guide per request, enforced token by token
by the engine.

A guide is upstream's pair of guided-decoding inputs (tensorrtllm_backend's `guided_decoding_guide_type`
and `guided_decoding_guide`: json, json_schema, regex, ebnf_grammar), the request language every target
shares: the torch engine compiles it with xgrammar (pipeline/runtime/engines/grammar.py), the llmapi engine
passes it to TensorRT-LLM's xgrammar backend as GuidedDecodingParams (llmapi_engine.py), the C++ backend
with its own xgrammar when its config names `guided_decoding_backend` and `xgrammar_tokenizer_info_path`
(LPX's repository stage writes both for the engine target: pipeline/stages/repository/xgrammar_info.py).
A choice becomes a grammar of its literal strings. The gateway compiles each guide once without a
tokenizer (xgrammar's parser), so a schema, regex or grammar it cannot enforce is a 400 naming the
field before any engine work; a served model that cannot enforce one is a 400 naming the target and the
fix - a guide is never dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..runtime.engines.guides import reason
from .errors import bad_request

MAX_GUIDE_CHARS = 65_536  # a schema's JSON, a regex or a grammar
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1024
STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
# vLLM's other structured_outputs fields: refused by name (LPX does not enforce them)
NOT_SERVED = (
    "structural_tag",
    "whitespace_pattern",
    "disable_any_whitespace",
    "disable_additional_properties",
)


@dataclass(frozen=True)
class Guide:
    """What the engine enforces: upstream's guide type and its text, and the field it came from."""

    type: str  # json | json_schema | regex | ebnf_grammar
    text: str
    param: str

    def values(self) -> dict[str, str]:
        return {"guided_decoding_guide_type": self.type, "guided_decoding_guide": self.text}


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise bad_request(f"{param} is not JSON - send a JSON schema (an object)", param) from None
    if not isinstance(schema, dict):
        raise bad_request(f"{param} must be a JSON schema (an object)", param)
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_GUIDE_CHARS:
        raise bad_request(f"{param} has {len(text)} characters; at most {MAX_GUIDE_CHARS} are taken", param)
    return text


def schema_guide(schema: Any, param: str) -> Guide:
    return check(Guide("json_schema", _schema_text(schema, param), param))


def choice_grammar(choices: Any, param: str) -> str:
    """An EBNF grammar whose sentences are exactly the given strings."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise bad_request(f"{param} must be a list of non-empty strings", param)
    if len(choices) > MAX_CHOICES or any(len(c) > MAX_CHOICE_CHARS for c in choices):
        raise bad_request(
            f"{param} takes at most {MAX_CHOICES} choices of {MAX_CHOICE_CHARS} characters each", param
        )
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param} must be a non-empty string", param)
    if len(value) > MAX_GUIDE_CHARS:
        raise bad_request(f"{param} has {len(value)} characters; at most {MAX_GUIDE_CHARS} are taken", param)
    return value


def from_structured_outputs(so: dict[str, Any]) -> Guide | None:
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""
    for key in NOT_SERVED:
        if so.get(key) not in (None, False, ""):
            raise bad_request(
                f"structured_outputs.{key} is not supported by this server - leave it out "
                "(json, regex, choice, grammar and json_object are)",
                f"structured_outputs.{key}",
            )
    unknown = sorted(set(so) - set(STRUCTURED_KEYS) - set(NOT_SERVED))
    if unknown:
        raise bad_request(
            f"structured_outputs has unknown fields {unknown} - send one of {', '.join(STRUCTURED_KEYS)}",
            "structured_outputs",
        )
    given = [k for k in STRUCTURED_KEYS if so.get(k) not in (None, False)]
    if len(given) > 1:
        raise bad_request(
            f"structured_outputs sets {' and '.join(given)} - send exactly one of them", "structured_outputs"
        )
    if not given:
        return None
    key, param = given[0], f"structured_outputs.{given[0]}"
    value = so[key]
    if key == "json":
        return schema_guide(value, param)
    if key == "json_object":
        if value is not True:
            raise bad_request(f"{param} must be true (or left out)", param)
        return Guide("json", "", param)
    if key == "regex":
        return check(Guide("regex", _text(value, param), param))
    if key == "choice":
        return check(Guide("ebnf_grammar", choice_grammar(value, param), param))
    return check(Guide("ebnf_grammar", _text(value, param), param))


def from_response_format(rf: dict[str, Any]) -> Guide | None:
    """OpenAI's response_format: text (nothing), json_object, or json_schema {name, schema, strict}."""
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json", "", "response_format")
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise bad_request(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                "response_format.json_schema",
            )
        return schema_guide(spec["schema"], "response_format.json_schema.schema")
    raise bad_request(
        f"response_format {kind!r} is not supported - send text, json_object or json_schema",
        "response_format.type",
    )


def check(guide: Guide) -> Guide:
    """Parse the guide with xgrammar (no tokenizer needed): a 400 naming the field when it cannot be
    enforced (a bad regex, an EBNF error, a schema feature xgrammar lacks)."""
    import xgrammar

    try:
        if guide.type == "json_schema":
            xgrammar.Grammar.from_json_schema(guide.text, any_whitespace=False, strict_mode=True)
        elif guide.type == "regex":
            xgrammar.Grammar.from_regex(guide.text)
        elif guide.type == "ebnf_grammar":
            xgrammar.Grammar.from_ebnf(guide.text)
    except Exception as exc:
        raise bad_request(f"{guide.param} cannot be enforced: {reason(exc)} - fix it", guide.param) from None
    return guide


def request_guide(req: Any) -> Guide | None:
    """The guide of a completions or chat request (structured_outputs, else response_format)."""
    so = getattr(req, "structured_outputs", None)
    rf = getattr(req, "response_format", None)
    guide = from_structured_outputs(so) if so else None
    other = from_response_format(rf) if rf else None
    if guide is not None and other is not None:
        raise bad_request(
            "response_format and structured_outputs both constrain the answer - send one of them",
            "structured_outputs",
        )
    return guide or other


def engine_values(guide: Guide, info: Any) -> dict[str, str]:
    """The engine inputs of a guide, or a 400 naming the target and the fix when it cannot enforce one."""
    if "guided_decoding_guide_type" not in info.inputs:
        raise bad_request(
            f"{guide.param} needs guided decoding, and the served model declares no "
            "guided_decoding_guide_type input (the TensorRT-LLM 0.16 line's backend has none) - serve a "
            "TensorRT-LLM 1.x line, or the torch, llmapi or vllm target, or leave it out",
            guide.param,
        )
    engine = next((p for name, p in info.params.items() if name != "preprocessing"), {})
    if "executor_worker_path" in engine:  # only the C++ tensorrtllm backend has it: the `engine` target
        if engine.get("guided_decoding_backend") != "xgrammar" or not engine.get(
            "xgrammar_tokenizer_info_path"
        ):
            raise bad_request(
                f"{guide.param} needs guided decoding, which the `engine` target's tensorrt_llm model has "
                "off - set its guided_decoding_backend parameter to xgrammar and xgrammar_tokenizer_info_path "
                "to the tokenizer's xgrammar info JSON ('lpx repo' writes both for a TensorRT-LLM 1.x engine "
                "whose tokenizer has a tokenizer.json and an eos id; its summary's guided_decoding says why "
                "not), or serve the torch or llmapi target, or leave it out",
                guide.param,
            )
    return guide.values()
