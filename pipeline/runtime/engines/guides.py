"""Upstream's guided-decoding inputs, shared by the targets that enforce them (torch: grammar.py; llmapi:
llmapi_engine.py). Pure Python plus xgrammar's grammar parser (no tokenizer, no torch), so the llmapi
target's Triton model can use it inside the TensorRT-LLM container.

A guide is the pair `guided_decoding_guide_type` / `guided_decoding_guide` (tensorrtllm_backend's names
and types: json, json_schema, regex, ebnf_grammar). `request_guide` reads it from an engine request's
options and refuses what no target can run (an unknown type, a guide without its text, min_tokens with a
guide); `schema_ebnf` is the one grammar both targets enforce for a JSON schema.
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import LpxError

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
OPTIONS = ("guided_decoding_guide_type", "guided_decoding_guide")

# xgrammar 0.2.9 writes a string with minLength / maxLength as `"\"" x_characters{m, n} "\""` with
# `x_characters ::= [^\"\\\r\n]`: control bytes (0x00-0x1f but CR, LF) pass, so a raw \x01 ends up
# inside a JSON string (invalid JSON), and escapes cannot be written at all. Such a character is one
# JSON string character instead: anything but a control byte, a quote or a backslash, or one escape.
_BOUNDED_CHAR = '[^\\"\\\\\\r\\n]'
_JSON_CHAR = '([^\\0-\\x1f\\"\\\\] | ("\\\\" ([\\"\\\\/bfnrt] | ("u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]))))'


def schema_ebnf(xgr: Any, schema: str) -> str:
    """The grammar of a JSON schema (compact separators, strict: no extra properties) as EBNF, with
    xgrammar's length-bounded string characters replaced by JSON's (see _BOUNDED_CHAR)."""
    text = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True))
    return text.replace(_BOUNDED_CHAR, _JSON_CHAR)


def reason(exc: Exception) -> str:
    """xgrammar's message without its log prefix ("[12:00:00] /project/cpp/x.cc:94: ")."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", text)[:300]


def request_guide(options: dict) -> tuple[str, str] | None:
    """(guide type, guide text) of an engine request's options, or None when it has no guide. Refused
    with a LpxError naming the fix: a guide without its type, an unknown type, a non-json guide without
    its text, and min_tokens > 0 with any guide (the gateway sends ignore_eos as min_tokens = max_tokens):
    once the answer is complete the grammar allows only the end id, which min_tokens forbids."""
    guide_type = str(options.get("guided_decoding_guide_type") or "")
    guide = str(options.get("guided_decoding_guide") or "")
    if not guide_type:
        if guide:
            raise LpxError("guided_decoding_guide needs guided_decoding_guide_type - send both")
        return None
    if guide_type not in GUIDE_TYPES:
        raise LpxError(
            f"guided_decoding_guide_type {guide_type!r} is not supported - send one of {', '.join(GUIDE_TYPES)}"
        )
    if guide_type != "json" and not guide:
        raise LpxError(f"guided_decoding_guide is missing - a {guide_type} guide needs its text")
    if int(options.get("min_tokens") or 0) > 0:
        raise LpxError(
            "min_tokens cannot be combined with guided decoding: a complete answer's grammar allows only "
            "the end id, which min_tokens forbids - leave min_tokens out"
        )
    return guide_type, guide
