"""The request bodies of /v1/completions and /v1/chat/completions (pydantic), and what is refused.

Types are OpenAI's, without coercion (pydantic's strict mode): `"4"` or `true` is not an integer, `"0.5"`
is not a number, `"yes"` is not a boolean; a number field takes a JSON integer, as OpenAI's does. Every
number and list is bounded (a value the engine's int32 / uint64 inputs cannot hold is a 400 naming the
field, never a 500). Unknown fields are refused (as OpenAI does) so a misspelt parameter is not silently
ignored; fields a client library sends by habit (user, metadata, store, service_tier) are accepted and
ignored. Fields the gateway cannot honour (n > 1, best_of, logit_bias, suffix, echo, tools, response
formats other than text before structured outputs) are declared so that they are refused with a message naming the fix rather than
"unknown". `read_json` reads the body first (media type, UTF-8, JSON, duplicate keys, depth).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from .errors import ApiError, bad_request, from_validation

MAX_STOPS = 4
MAX_STOP_CHARS = 256  # each stop string; the stop matcher's per-token work grows with the longest one
MAX_PROMPTS = 2048  # entries of a prompt list (only one prompt per request is served; the rest is a 400)
MAX_PROMPT_IDS = 1 << 20  # token ids of one prompt (max_input_len refuses long ones with its numbers)
MAX_MESSAGES = 4096
MAX_PARTS = 1024  # content parts of one message
INT32 = 2**31 - 1  # the engine's int32 inputs (request_output_len, runtime_top_k)
INT64 = 2**63 - 1  # seed (OpenAI's is an int64; the engine's input is uint64, so >= 0 here)

Short = Annotated[str, StringConstraints(max_length=256)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


def _kind(value: Any) -> str:
    """A JSON value's kind, for messages ("a string", "a boolean", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _invalid(message: str, **ctx: Any) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message, ctx)


def _ids(value: list, where: str) -> list[int]:
    if len(value) > MAX_PROMPT_IDS:
        raise _invalid(f"has {len(value)} token ids{where}; at most {MAX_PROMPT_IDS} are taken")
    for i, t in enumerate(value):
        if type(t) is not int or t < 0:  # (a JSON boolean is never a token id)
            got = t if type(t) is int else _kind(t)
            raise _invalid(f"holds {got} at {where.strip(' in')}[{i}]: token ids are integers >= 0")
    return value


def check_prompt(value: Any) -> Any:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    shape = "must be a string, a list of strings, a list of token ids or a list of lists of token ids"
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _invalid(f"{shape}, not {_kind(value)}")
    if len(value) > MAX_PROMPTS:
        raise _invalid(f"holds {len(value)} entries; at most {MAX_PROMPTS} are taken")
    if not value or isinstance(value[0], int):  # token ids (a boolean among them is refused by _ids)
        return _ids(value, "")
    if all(isinstance(x, str) for x in value):
        return value
    if all(isinstance(x, list) for x in value):
        return [_ids(x, f" in [{i}]") for i, x in enumerate(value)]
    odd = next(i for i, x in enumerate(value) if type(x) is not type(value[0]) or isinstance(x, bool | dict))
    raise _invalid(f"{shape}; [{odd}] is {_kind(value[odd])}")


def check_stop(value: Any) -> Any:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        raise _invalid(f"must be a string or a list of strings, not {_kind(value)}")
    if len(stops) > MAX_STOPS:
        raise _invalid(f"has {len(stops)} sequences; send at most {MAX_STOPS}")
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise _invalid(f"holds {_kind(s)} at [{i}]; stop sequences are strings")
        if len(s) > MAX_STOP_CHARS:
            raise _invalid(f"[{i}] has {len(s)} characters; a stop sequence may have {MAX_STOP_CHARS}")
    return value


class Sampling(Body):
    """What both endpoints share."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    max_tokens: int | None = Field(None, ge=1, le=INT32)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=INT32, description="vLLM's extension: -1 or 0 = no top-k")
    n: int | None = Field(None, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Any = None
    seed: int | None = Field(None, ge=0, le=INT64)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[Short, Annotated[float, Field(ge=-100, le=100)]] | None = Field(None, max_length=300)
    user: Annotated[str, StringConstraints(max_length=512)] | None = None
    metadata: (
        dict[
            Annotated[str, StringConstraints(max_length=64)],
            Annotated[str, StringConstraints(max_length=512)],
        ]
        | None
    ) = Field(None, max_length=16)
    store: bool | None = None
    service_tier: Short | None = None
    # -- structured outputs (structured.py): vLLM's extension and OpenAI's response_format ----------
    structured_outputs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    _stop = field_validator("stop", mode="plain")(check_stop)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def refuse_common(self) -> None:
        """The refusals both endpoints share (400 naming the fix)."""
        if self.n not in (None, 1):
            raise bad_request(
                f"n = {self.n} is not supported - send n = 1 (repeat the request for more)", "n"
            )
        if self.logit_bias:
            raise bad_request("logit_bias is not supported by this server - leave it out", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream: true", "stream_options")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Sampling):
    prompt: Any
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=20)

    _prompt = field_validator("prompt", mode="plain")(check_prompt)

    def refuse(self) -> None:
        self.refuse_common()
        if self.best_of not in (None, 1):
            raise bad_request(
                f"best_of = {self.best_of} is not supported - leave it out (or send 1)", "best_of"
            )
        if self.suffix:
            raise bad_request("suffix is not supported (no fill-in-the-middle) - leave it out", "suffix")
        if self.echo:
            raise bad_request("echo is not supported - leave it out and prepend the prompt yourself", "echo")
        if self.logprobs:
            raise bad_request(
                f"logprobs = {self.logprobs} asks for alternatives: the engine returns only the sampled "
                "token's log probability - send logprobs 0",
                "logprobs",
            )

    def single_prompt(self) -> str | list[int]:
        """The one prompt (text or token ids); a batch of several is refused (send them as requests)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise bad_request(
                    f"prompt holds {len(p)} prompts; this server answers one prompt per request - "
                    "send them as separate requests",
                    "prompt",
                )
            p = p[0]
        if not p:
            raise bad_request("prompt is empty - send some text", "prompt")
        return p


def check_content(value: Any) -> Any:
    """null, a string, or a list of text parts ({"type": "text", "text": "..."}: only text is served)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _invalid(f"must be a string or a list of text parts, not {_kind(value)}")
    if len(value) > MAX_PARTS:
        raise _invalid(f"has {len(value)} parts; at most {MAX_PARTS} are taken")
    text_part = '{"type": "text", "text": "..."}'
    for i, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = repr(part.get("type")) if isinstance(part, dict) else _kind(part)
            raise _invalid(f"[{i}] is {kind}: only text parts are served ({text_part})")
        if not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
            raise _invalid(f"[{i}] must be exactly {text_part} with a string")
    return value


class ChatMessage(Body):
    """One message; the fields OpenAI's message types have (others are refused, as OpenAI does)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = None
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    tool_calls: Annotated[list[dict[str, Any]], Field(max_length=128)] | None = None
    tool_call_id: Short | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None

    _content = field_validator("content", mode="plain")(check_content)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part["text"] for part in self.content)
        return self.content or ""

    def refuse(self, i: int) -> None:
        """content may be null (or left out) only on an assistant message with tool_calls, as OpenAI's."""
        if self.content is None and not (
            self.role == "assistant" and (self.tool_calls or self.function_call)
        ):
            raise bad_request(
                f"messages[{i}].content is required on a {self.role} message (a string or a list of "
                "text parts; null only on an assistant message with tool_calls)",
                f"messages[{i}].content",
            )
        if self.role == "tool" and not self.tool_call_id:
            raise bad_request(
                f"messages[{i}].tool_call_id is required on a tool message", f"messages[{i}].tool_call_id"
            )


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: Annotated[list[Any], Field(max_length=128)] | None = None
    tool_choice: Any = None
    functions: Annotated[list[Any], Field(max_length=128)] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    modalities: Annotated[list[Short], Field(max_length=4)] | None = None

    def refuse(self) -> None:
        self.refuse_common()
        for i, message in enumerate(self.messages):
            message.refuse(i)
        for name in ("functions", "function_call"):  # (tools and tool_choice: tools.py)
            value = getattr(self, name)
            if value and value != "none":
                raise bad_request(
                    f"{name} is OpenAI's deprecated form - send tools and tool_choice instead", name
                )
        if self.modalities and self.modalities != ["text"]:
            raise bad_request("only the text modality is served - leave modalities out", "modalities")
        if self.top_logprobs:
            raise bad_request(
                f"top_logprobs = {self.top_logprobs} asks for alternatives: the engine returns only the "
                "sampled token's log probability - send top_logprobs 0 or leave it out",
                "top_logprobs",
            )
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise bad_request(
                    "max_tokens and max_completion_tokens differ - send one of them",
                    "max_completion_tokens",
                )

    def asked_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def model_mismatch(asked: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{asked}' does not exist here - this server serves '{served}' (GET /v1/models lists it)",
        code="model_not_found",
        param="model",
    )


# -- the body before the models: media type, UTF-8, strict JSON ------------------------------------
MAX_DEPTH = 32  # nesting of arrays and objects; OpenAI's bodies need 5 (a tool's JSON schema a few more)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # a \uD800-\uDFFF escape: a pair, or a lone surrogate


def check_media_type(values: list[str]) -> None:
    """415 unless the one Content-Type is application/json (charset utf-8 allowed), so that a web page
    cannot drive a local gateway with a 'simple' request (text/plain, a form) that skips CORS' preflight."""
    got = values[0] if len(values) == 1 else (", ".join(values) or None)
    media, _, params = (got or "").partition(";")
    ok = len(values) == 1 and media.strip().lower() == "application/json"
    for param in filter(None, (p.strip() for p in params.split(";"))):
        name, _, value = param.partition("=")
        ok = (
            ok and name.strip().lower() == "charset" and value.strip().strip('"').lower() in ("utf-8", "utf8")
        )
    if not ok:
        raise ApiError(
            415,
            f"Content-Type {got!r} is not accepted - send the body as JSON with "
            "'Content-Type: application/json'",
            code="unsupported_media_type",
            param="Content-Type",
        )


class _NotJson(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _NotJson(f"the key {dup!r} appears twice in one object")
    return obj


def _constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value (numbers are finite)")


def _walk(obj: Any, surrogates: bool) -> None:
    """Refuse nesting deeper than MAX_DEPTH and (when `surrogates`) strings that are not UTF-8."""
    level: list[Any] = [obj]
    for _ in range(MAX_DEPTH + 1):
        below: list[Any] = []
        for item in level:
            values = item.values() if isinstance(item, dict) else item
            if surrogates and isinstance(item, dict):
                values = [*item, *values]
            for v in values:
                if isinstance(v, list | dict):
                    below.append(v)
                elif surrogates and isinstance(v, str):
                    try:
                        v.encode("utf-8")
                    except UnicodeEncodeError:
                        raise _NotJson("a string holds a lone surrogate (\\ud800-\\udfff)") from None
        if not below:
            return
        level = below
    raise _NotJson(f"it is nested deeper than {MAX_DEPTH} levels")


def read_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object: UTF-8, strict JSON (no NaN / Infinity, no duplicate keys, at most
    MAX_DEPTH levels, no lone surrogates); anything else is a 400 `invalid_json`."""
    if not raw.strip():
        raise bad_request("The request body is empty - send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"The request body is not valid UTF-8 (at byte {exc.start}) - send JSON encoded as UTF-8",
            code="invalid_json",
        ) from None
    try:
        obj = json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
        surrogates = _SURROGATE.search(text) is not None
        if surrogates or text.count("[") + text.count("{") > MAX_DEPTH:
            _walk(obj, surrogates)
    except RecursionError:
        raise bad_request(
            f"The request body is not valid JSON (it is nested deeper than {MAX_DEPTH} levels)",
            code="invalid_json",
        ) from None
    except ValueError as exc:  # JSONDecodeError, _NotJson, an integer of more than 4300 digits
        raise bad_request(
            f"The request body is not valid JSON ({exc}) - send a JSON object", code="invalid_json"
        ) from None
    if not isinstance(obj, dict):
        raise bad_request(f"The request body must be a JSON object, not {_kind(obj)}", code="invalid_json")
    return obj


def parse_body(raw: bytes, model: type[Body]) -> Any:
    """The request model from the body's bytes (400 in OpenAI's shape naming the field)."""
    from pydantic import ValidationError

    obj = read_json(raw)
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise from_validation(exc) from None
