"""Tool calling on /v1/chat/completions: the tools go to the chat template, and `tool_choice` decides.

- `none` (or no tools): plain text; the tools are left out of the prompt (vLLM's default too);
- `auto` (the default with tools): the model answers freely; the family's parser (toolparsers.py) finds
  calls in the whole answer - a stream holds the answer back until it ends, then sends calls or text;
- `required`: the answer is constrained (structured.py's guide) to a JSON array of
  `{"name": <one of the tools>, "parameters": <its schema>}` (one item when parallel_tool_calls is false);
- named (`{"type": "function", "function": {"name": ...}}`): the answer is constrained to that function's
  parameters schema, streamed as argument deltas as they come.
So even a small model returns a call that parses and validates against the tool's schema. Calls are
answered in OpenAI's shape (`tool_calls`, `finish_reason: tool_calls`); assistant messages with
tool_calls and tool messages go back through the template (arguments as objects, as templates expect).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from . import toolparsers
from .errors import bad_request
from .structured import Guide, schema_guide

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def _function(tool: Any, i: int) -> dict[str, Any]:
    param = f"tools[{i}]"
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(tool.get("function"), dict)
    ):
        raise bad_request(f'{param} must be {{"type": "function", "function": {{"name": ...}}}}', param)
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise bad_request(
            f"{param}.function.name must be a string of 1-64 characters", f"{param}.function.name"
        )
    params = fn.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(params, dict):
        raise bad_request(f"{param}.function.parameters must be a JSON schema (an object)", param)
    return {**fn, "parameters": params}


@dataclass
class ToolMode:
    """One request's tools and what tool_choice asks for."""

    mode: str  # none | auto | required | named
    functions: list[dict[str, Any]] = field(default_factory=list)
    name: str | None = None  # the named function
    parser: str = "hermes"
    guide: Guide | None = None

    @property
    def calls(self) -> bool:
        return self.mode != "none"


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if names else "none"), None
    if choice in ("none", "auto", "required"):
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(fn, dict) or choice.get("type") != "function" or not isinstance(fn.get("name"), str):
        raise bad_request(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if fn["name"] not in names:
        raise bad_request(f"tool_choice names {fn['name']!r}, which is not among the tools", "tool_choice")
    return "named", fn["name"]


def tool_mode(req: Any, parser: str) -> ToolMode:
    """Check tools / tool_choice (400 naming the field) and build the guide of required / named."""
    functions = [_function(t, i) for i, t in enumerate(req.tools or [])]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise bad_request("tools holds two functions of the same name - name each once", "tools")
    mode, name = _choice(req.tool_choice, names)
    if mode in ("auto", "required") and not functions:
        raise bad_request(
            f"tool_choice {mode!r} needs tools - send the tools, or leave tool_choice out", "tools"
        )
    tm = ToolMode(mode, functions, name, parser)
    if mode == "named":
        fn = next(f for f in functions if f["name"] == name)
        tm.guide = schema_guide(fn["parameters"], "tools")
    elif mode == "required":
        items = [
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "parameters": f["parameters"]},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for f in functions
        ]
        schema: dict[str, Any] = {"type": "array", "items": {"anyOf": items}, "minItems": 1}
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        tm.guide = schema_guide(schema, "tools")
    return tm


def check_template(tm: ToolMode, reads_tools: bool) -> None:
    """tool_choice auto with a chat template that never renders the tools: the model would not see them
    and would answer as if none were sent, so refuse (400) and name the ways that do work."""
    if tm.mode == "auto" and tm.functions and not reads_tools:
        raise bad_request(
            "tool_choice 'auto' needs a chat template that shows the model its tools, and this model's "
            "template never reads `tools` - use tool_choice 'required' or name a function (the answer is "
            "then constrained to a valid call), or set serving.openai.chat_template to a template that "
            "renders tools",
            "tool_choice",
        )


def template_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The messages as chat templates take them: text content, tool-call arguments as objects."""
    out = []
    for m in messages:
        d = m.model_dump(exclude_none=True) | {"content": m.text()}
        calls = []
        for call in d.get("tool_calls") or []:
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass  # a template can still print the text
            calls.append({**call, "function": fn})
        if calls:
            d["tool_calls"] = calls
        out.append(d)
    return out


def template_tools(tm: ToolMode) -> list[dict[str, Any]] | None:
    return [{"type": "function", "function": f} for f in tm.functions] if tm.calls else None


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


class ToolCalls:
    """The answer of a tool request as OpenAI's message / stream deltas."""

    def __init__(self, tm: ToolMode) -> None:
        self.tm = tm
        self.text = ""
        self.id = call_id()
        self.started = False

    def parse(self, text: str) -> tuple[str | None, list[tuple[str, str]]]:
        """(content, [(name, arguments)]) of a whole answer."""
        tm = self.tm
        if tm.mode == "named":
            return None, [(tm.name or "", text)]
        if tm.mode == "required":
            try:
                items = json.loads(text)
                return None, [(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
            except (ValueError, TypeError, KeyError):
                return text, []  # cut short by max_tokens: the text as it is
        return toolparsers.PARSERS[tm.parser](text)

    @staticmethod
    def _calls(calls: list[tuple[str, str]], first_id: str) -> list[dict[str, Any]]:
        return [
            {
                "id": first_id if i == 0 else call_id(),
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for i, (name, args) in enumerate(calls)
        ]

    def message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        content, calls = self.parse(text)
        if reason == "length" and self.tm.mode == "named":
            return {"role": "assistant", "content": text}, reason
        if not calls:
            return {"role": "assistant", "content": content}, reason
        return {
            "role": "assistant",
            "content": content,
            "tool_calls": self._calls(calls, self.id),
        }, "tool_calls"

    def delta(self, piece: str) -> dict[str, Any] | None:
        """A streamed piece: the named function's argument delta, else held until the end."""
        if self.tm.mode != "named":
            self.text += piece
            return None
        call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
        if not self.started:
            self.started = True
            call = {
                "index": 0,
                "id": self.id,
                "type": "function",
                "function": {"name": self.tm.name, "arguments": piece},
            }
        return {"tool_calls": [call]}

    def end(self, reason: str) -> tuple[list[dict[str, Any]], str]:
        """The deltas still to send once the answer is complete, and the finish_reason."""
        if self.tm.mode == "named":
            head = [self.delta("")] if not self.started else []
            return head, ("tool_calls" if reason != "length" else reason)
        content, calls = self.parse(self.text)
        if not calls:
            return ([{"content": content}] if content else []), reason
        deltas = []
        for i, call in enumerate(self._calls(calls, self.id)):
            deltas.append({"tool_calls": [{"index": i, **call}]})
        if content:
            deltas.insert(0, {"content": content})
        return deltas, "tool_calls"


def parser_for(codec: Any, explicit: str | None = None) -> str:
    """The tool parser of the served model (toolparsers.pick), worked out once per codec: the setting
    (LPX_TOOL_PARSER), else the tokenizer folder's config.json model_type, else the chat template."""
    import os

    cached = getattr(codec, "_lpx_tool_parser", None)
    if cached is not None:
        return cached
    model_type = None
    config = codec.folder / "config.json"
    if config.is_file():
        try:
            model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            model_type = None
    template = codec.template or getattr(codec.tokenizer, "chat_template", None)
    explicit = explicit or os.environ.get("LPX_TOOL_PARSER") or None
    try:
        name = toolparsers.pick(explicit, model_type, template if isinstance(template, str) else None)
    except ValueError as exc:
        raise bad_request(f"{exc} - fix LPX_TOOL_PARSER", "tools") from None
    codec._lpx_tool_parser = name
    return name
