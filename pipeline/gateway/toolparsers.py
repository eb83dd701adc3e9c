"""Tool-call parsers, one per model family LPX's configs name, for `tool_choice: auto` (the model decides):
each finds the calls in a whole answer and returns (content left, [(name, arguments as a JSON text)]).

- `hermes` (Qwen2.5, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks;
- `llama3_json` (Llama 3.x): the answer is one JSON object `{"name": ..., "parameters": {...}}` (or
  several separated by `;`), optionally after `<|python_tag|>`;
- `mistral`: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}` (the marker is a
  special token, so the decoded text may start with the array itself).

`pick` chooses from an explicit setting, else the checkpoint's config model_type, else the chat
template's markers. Text that does not parse as calls is content, never an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Call = tuple[str, str]
PARSERS: dict[str, Callable[[str], tuple[str | None, list[Call]]]] = {}
MODEL_TYPES = {"llama": "llama3_json", "qwen2": "hermes", "qwen3": "hermes", "mistral": "mistral"}


def _call(obj: Any, args_key: str) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _parser(name: str):
    def register(fn):
        PARSERS[name] = fn
        return fn

    return register


@_parser("hermes")
def hermes(text: str) -> tuple[str | None, list[Call]]:
    calls = []
    for block in re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, flags=re.S):
        try:
            call = _call(json.loads(block.strip()), "arguments")
        except ValueError:
            call = None
        if call is not None:
            calls.append(call)
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")].strip()
    return content or None, calls


@_parser("llama3_json")
def llama3_json(text: str) -> tuple[str | None, list[Call]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    for part in body.split(";"):
        try:
            call = _call(json.loads(part.strip()), "parameters")
        except ValueError:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
    return None, calls


@_parser("mistral")
def mistral(text: str) -> tuple[str | None, list[Call]]:
    at = text.find("[TOOL_CALLS]")
    content, body = (text[:at], text[at + len("[TOOL_CALLS]") :]) if at >= 0 else ("", text)
    try:
        items = json.loads(body.strip())
    except ValueError:
        return text, []
    items = items if isinstance(items, list) else [items]
    calls = [c for c in (_call(i, "arguments") for i in items) if c is not None]
    if not calls or len(calls) != len(items):
        return text, []
    return content.strip() or None, calls


def pick(explicit: str | None, model_type: str | None, template: str | None) -> str:
    """The parser for the served model: the setting, else config.json's model_type, else the template."""
    if explicit:
        if explicit not in PARSERS:
            raise ValueError(f"tool parser {explicit!r} is not one of {', '.join(sorted(PARSERS))}")
        return explicit
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    template = template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return "hermes"
