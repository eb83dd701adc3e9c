"""Guided decoding's request language, without a tokenizer: upstream's guide inputs
(`guided_decoding_guide_type` / `guided_decoding_guide`, tensorrtllm_backend's names: json, json_schema,
regex, ebnf_grammar) checked and turned into the grammar every LPX target enforces. xgrammar parses them
(the grammar engine vLLM, SGLang and TensorRT-LLM use); this module imports neither torch nor
transformers, so the gateway and the vllm target use it as the torch target's grammar.py does.
"""

from __future__ import annotations

import re
from functools import lru_cache
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


def check_type(guide_type: str) -> None:
    """A LpxError naming the types there are, for one that is not one of them."""
    if guide_type not in GUIDE_TYPES:
        raise LpxError(
            f"guided_decoding_guide_type {guide_type!r} is not supported - send one of {', '.join(GUIDE_TYPES)}"
        )


def requested(options: dict) -> tuple[str, str] | None:
    """(guide type, guide text) of a request's options, None when unguided; a LpxError naming the fix
    for a guide without its type, an unknown type, a missing text, or min_tokens beside a guide."""
    guide_type = options.get("guided_decoding_guide_type")
    if not guide_type:
        if options.get("guided_decoding_guide"):
            raise LpxError("guided_decoding_guide needs guided_decoding_guide_type - send both")
        return None
    guide_type, guide = str(guide_type), str(options.get("guided_decoding_guide") or "")
    check_type(guide_type)
    if guide_type != "json" and not guide:
        raise LpxError(f"guided_decoding_guide is missing - a {guide_type} guide needs its text")
    if int(options.get("min_tokens") or 0) > 0:
        raise LpxError(
            "min_tokens cannot be combined with guided decoding: a complete answer's grammar allows only "
            "the end id, which min_tokens forbids - leave min_tokens out"
        )
    return guide_type, guide


@lru_cache(maxsize=256)  # the same schema, asked again and again, is converted once
def ebnf(guide_type: str, guide: str) -> str:
    """The guide as one EBNF grammar (xgrammar's dialect, which vLLM's xgrammar backend compiles): JSON
    compact as on the torch target, a schema strict and with JSON string characters (schema_ebnf); a
    LpxError naming the fix when it does not parse."""
    import xgrammar as xgr

    check_type(guide_type)
    try:
        if guide_type == "json":
            return str(xgr.Grammar.builtin_json_grammar())
        if guide_type == "json_schema":
            return schema_ebnf(xgr, guide)
        if guide_type == "regex":
            return str(xgr.Grammar.from_regex(guide))
        return str(xgr.Grammar.from_ebnf(guide))
    except Exception as exc:  # xgrammar's parse errors (RuntimeError / ValueError), bad JSON
        raise LpxError(f"the {guide_type} guide is invalid ({reason(exc)}) - send a valid one") from None
