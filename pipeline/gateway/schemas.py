"""The request bodies of /v1/completions and /v1/chat/completions (pydantic), and what is refused.

Types are OpenAI's, without coercion (pydantic's strict mode): `"4"` or `true` is not an integer, `"0.5"`
is not a number, `"yes"` is not a boolean; a number field takes a JSON integer, as OpenAI's does. Every
number and list is bounded (a value the engine's int32 / uint64 inputs cannot hold is a 400 naming the
field, never a 500). Unknown fields are refused (as OpenAI does) so a misspelt parameter is not silently
ignored; fields a client library sends by habit (user, metadata, store, service_tier) are accepted and
ignored. Fields the gateway cannot honour (best_of, logit_bias, suffix) are declared so that they are
refused with a message naming the fix rather than "unknown". Structured outputs (response_format,
structured_outputs) and tools are served (structured.py, tools.py). vLLM's sampling extensions the load
tools send (top_k, min_tokens, ignore_eos, repetition_penalty) are taken with vLLM's names and bounds.
`read_json` reads the body first (media type, UTF-8, JSON, duplicate keys, depth).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from .body import _kind, check_media_type, parse_body, read_json  # noqa: F401 (their old home)
from .errors import ApiError, bad_request

MAX_STOPS = 4
MAX_STOP_CHARS = 256  # each stop string; the stop matcher's per-token work grows with the longest one
MAX_PROMPTS = 2048  # entries of a prompt list
MAX_CHOICES = 128  # prompts x n of one request: each is one engine request
MAX_PROMPT_IDS = 1 << 20  # token ids of one prompt (max_input_len refuses long ones with its numbers)
MAX_MESSAGES = 4096
MAX_PARTS = 1024  # content parts of one message
INT32 = 2**31 - 1  # the engine's int32 inputs (request_output_len, runtime_top_k)
INT64 = 2**63 - 1  # seed: OpenAI's is any int64; the engine's uint64 input gets it modulo 2**64

Short = Annotated[str, StringConstraints(max_length=256)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


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
    seed: int | None = Field(None, ge=-INT64 - 1, le=INT64)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=INT32, description="vLLM's: > 0, 1 = off")
    min_tokens: int | None = Field(None, ge=0, le=INT32, description="vLLM's: EOS is held back until then")
    ignore_eos: bool | None = Field(None, description="vLLM's: run to max_tokens (sent as min_tokens)")
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
        if self.logit_bias:
            raise bad_request("logit_bias is not supported by this server - leave it out", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream: true", "stream_options")

    def sent_max_tokens(self) -> tuple[str, int | None]:
        """(the parameter's name, the max_tokens it asks for; None: not sent)."""
        return "max_tokens", self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Sampling):
    prompt: Any
    logprobs: int | None = Field(None, ge=0, le=20)  # OpenAI takes 5, vLLM 20 (its max_logprobs)
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
        if self.echo and self.logprobs is not None:
            raise bad_request(
                "echo with logprobs asks for the prompt's log probabilities, which the engines do not "
                "return - leave out echo or logprobs",
                "echo",
            )

    def prompts(self) -> list[str | list[int]]:
        """The prompts (text or token ids): one, or a batch; each answered with n choices."""
        p = self.prompt
        batch = p if isinstance(p, list) and p and isinstance(p[0], str | list) else [p]
        for i, one in enumerate(batch):
            if not one:
                where = "" if len(batch) == 1 else f"[{i}]"
                raise bad_request(f"prompt{where} is empty - send some text", "prompt")
        choices = len(batch) * (self.n or 1)
        if choices > MAX_CHOICES:
            raise bad_request(
                f"{len(batch)} prompts x n = {self.n or 1} ask for {choices} choices; at most {MAX_CHOICES} "
                "are answered per request - send fewer prompts or a smaller n",
                "n" if len(batch) == 1 else "prompt",
            )
        return batch


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
        if self.top_logprobs and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true - send both", "top_logprobs")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise bad_request(
                    "max_tokens and max_completion_tokens differ - send one of them",
                    "max_completion_tokens",
                )

    def sent_max_tokens(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


def model_mismatch(asked: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{asked}' does not exist here - this server serves '{served}' (GET /v1/models lists it)",
        code="model_not_found",
        param="model",
    )
