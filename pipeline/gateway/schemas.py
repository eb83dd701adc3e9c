"""The request bodies of /v1/completions and /v1/chat/completions (pydantic), and what is refused.

Unknown fields are refused (as OpenAI does) so a misspelt parameter is not silently ignored; fields a
client library sends by habit (user, metadata, store, service_tier) are accepted and ignored. Fields the
gateway cannot honour (n > 1, best_of, logit_bias, suffix, echo, tools, response formats other than
text) are declared so that they are refused with a message naming the fix rather than "unknown".
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import ApiError, bad_request

MAX_STOPS = 4


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class Sampling(Body):
    """What both endpoints share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="vLLM's extension: -1 or 0 = no top-k")
    n: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        stops = [s for s in stops if s]
        if len(stops) > MAX_STOPS:
            raise bad_request(f"'stop' has {len(stops)} sequences; send at most {MAX_STOPS}", "stop")
        return stops

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
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise bad_request(f"seed {self.seed} is outside 0..2^64-1", "seed")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

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


class ContentPart(Body):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_call_id, refusal, ... kept for the template

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None

    def refuse(self) -> None:
        self.refuse_common()
        for name in ("tools", "functions", "tool_choice", "function_call"):
            value = getattr(self, name)
            if value and value != "none":
                raise bad_request(
                    f"{name} is not supported by this server (no tool calling) - leave it out", name
                )
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise bad_request(
                f"response_format {self.response_format.get('type')!r} is not supported - "
                "leave it out (plain text)",
                "response_format",
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
