"""One request on the fast path: prompt ids and engine inputs from an OpenAI body (`plan`), then the
engine's token stream turned into text pieces with stop sequences and exact counts (`Generation`).

Lengths follow the engine: a prompt above max_input_len, or prompt + max_tokens above max_seq_len, is a
400 with the numbers; without max_tokens a request gets what remains of max_seq_len, capped by
serving.max_tokens_cap. Sampling maps onto upstream's inputs (temperature, runtime_top_p, runtime_top_k,
seed, presence/frequency penalty); a value the served model does not declare is refused unless it is the
default. completion_tokens counts every id the engine generated for the answer, the end-of-sequence id
included, up to the one that completed a stop sequence.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError, bad_request
from .schemas import ChatCompletionRequest, CompletionRequest
from .text import StopText, TextCodec, prompt_ids
from .triton import Delta, EngineError, ModelInfo, Triton

DEFAULT_WITHOUT_LIMITS = 16  # max_tokens when neither max_seq_len nor max_tokens_cap is known


@dataclass
class Plan:
    ids: list[int]
    max_tokens: int
    values: dict[str, Any]  # engine inputs besides input_ids
    stops: list[str]
    logprobs: bool
    end_ids: frozenset[int]
    prompt: Any = None  # for the access log when prompts are logged
    tools: Any = None  # tools.ToolCalls when the answer may be tool calls


@dataclass
class Piece:
    """Text ready to send, with the log probabilities of the tokens behind it (when asked)."""

    text: str
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None


def end_ids(codec: TextCodec) -> list[int]:
    """The ids that end an answer: the tokenizer's EOS, then generation_config.json's (an int or a list)."""
    from ..runtime.model_args import eos_ids_in

    eos = codec.tokenizer.eos_token_id
    found = ([eos] if isinstance(eos, int) else []) + eos_ids_in(codec.folder, "generation_config.json")
    return list(dict.fromkeys(found))


def max_tokens_for(asked: int | None, n_prompt: int, info: ModelInfo, param: str) -> int:
    cap, seq, inp = info.max_tokens_cap, info.max_seq_len, info.max_input_len
    if inp and n_prompt > inp:
        raise bad_request(
            f"The prompt has {n_prompt} tokens, above the engine's max_input_len {inp} - shorten it",
            "messages" if param == "max_completion_tokens" else "prompt",
            code="context_length_exceeded",
        )
    room = seq - n_prompt if seq else None
    if room is not None and room < 1:
        raise bad_request(
            f"The prompt has {n_prompt} tokens, leaving no room below the engine's max_seq_len {seq} - "
            "shorten it",
            "prompt",
            code="context_length_exceeded",
        )
    if asked is None:
        choices = [x for x in (room, cap) if x]
        return min(choices) if choices else DEFAULT_WITHOUT_LIMITS
    if cap and asked > cap:
        raise bad_request(
            f"{param} = {asked} is above this server's limit of {cap} tokens (serving.max_tokens_cap) - "
            f"ask for at most {cap}",
            param,
        )
    if room is not None and asked > room:
        raise bad_request(
            f"The prompt ({n_prompt} tokens) + {param} ({asked}) = {n_prompt + asked} tokens is above the "
            f"engine's max_seq_len {seq} - ask for at most {room} tokens or shorten the prompt",
            param,
            code="context_length_exceeded",
        )
    return asked


def _sampling(req: CompletionRequest | ChatCompletionRequest, info: ModelInfo, vocab: int) -> dict[str, Any]:
    """Upstream's sampling inputs; a non-default value the model does not declare is refused. A top_k of
    the vocabulary or more keeps every token, so it is sent as 0 (no top-k): the same sampling, and a
    value every engine takes (the schema already bounds it to int32)."""
    top_k = req.top_k if req.top_k is not None and 0 < req.top_k < vocab else 0
    asked = {  # engine input -> (value, the client's parameter, set to something other than its default)
        "temperature": (
            1.0 if req.temperature is None else req.temperature,
            "temperature",
            req.temperature not in (None, 1.0),
        ),
        "runtime_top_p": (1.0 if req.top_p is None else req.top_p, "top_p", req.top_p not in (None, 1.0)),
        "runtime_top_k": (top_k, "top_k", top_k != 0),
        "seed": (req.seed, "seed", req.seed is not None),
        "presence_penalty": (req.presence_penalty, "presence_penalty", bool(req.presence_penalty)),
        "frequency_penalty": (req.frequency_penalty, "frequency_penalty", bool(req.frequency_penalty)),
    }
    values = {}
    for name, (value, param, set_) in asked.items():
        if name in info.inputs:
            if value is not None and (set_ or name in ("temperature", "runtime_top_p")):
                values[name] = value
        elif set_:
            raise bad_request(
                f"{param} is not taken by the served model (it declares no {name} input) - leave it out",
                param,
            )
    return values


def plan(
    req: CompletionRequest | ChatCompletionRequest, codec: TextCodec, info: ModelInfo, ends: list[int]
) -> Plan:
    """Check and translate one request (400 for anything the gateway or the engine would refuse)."""
    req.refuse()
    stops = req.stops()
    tm = None
    if isinstance(req, ChatCompletionRequest):
        tm, messages, ids = _chat_prompt(req, codec)
        prompt = messages
        asked, param = (
            req.asked_tokens(),
            "max_completion_tokens" if req.max_completion_tokens else "max_tokens",
        )
        logprobs = bool(req.logprobs)
    else:
        prompt = req.single_prompt()
        ids, asked, param = prompt_ids(codec, prompt), req.max_tokens, "max_tokens"
        logprobs = req.logprobs is not None
    if not ids:
        raise bad_request("The prompt is empty after tokenization - send some text", "prompt")
    max_tokens = max_tokens_for(asked, len(ids), info, param)
    if logprobs and not info.log_probs:
        raise bad_request(
            "logprobs are not available: the served model declares no output_log_probs - leave logprobs out",
            "logprobs",
        )
    values: dict[str, Any] = {
        "input_lengths": len(ids),
        "request_output_len": max_tokens,
        "streaming": True,
        "exclude_input_in_output": True,
        "return_num_input_tokens": True,
        **_sampling(req, info, codec.vocab_size),
    }
    if ends:
        values["end_id"] = ends[0]
        pad = codec.tokenizer.pad_token_id
        values["pad_id"] = pad if isinstance(pad, int) else ends[0]
    if logprobs:
        values["return_log_probs"] = True
    values.update(_guided(req, tm, info))
    calls = _tool_calls(tm)
    return Plan(ids, max_tokens, values, stops, logprobs, frozenset(ends), prompt, calls)


def _chat_prompt(req: ChatCompletionRequest, codec: TextCodec) -> tuple[Any, list[dict[str, Any]], list[int]]:
    """(tools.ToolMode, the messages as the template takes them, the prompt ids)."""
    from . import tools

    tm = tools.tool_mode(req, tools.parser_for(codec))
    messages = tools.template_messages(req.messages)
    return tm, messages, codec.encode_chat(messages, tools.template_tools(tm))


def _guided(req: CompletionRequest | ChatCompletionRequest, tm: Any, info: ModelInfo) -> dict[str, Any]:
    """The guided-decoding inputs of structured outputs or a required / named tool call (structured.py)."""
    from .structured import engine_values, request_guide

    guide = request_guide(req)
    if tm is not None and tm.guide is not None:
        if guide is not None:
            raise bad_request(
                f"tool_choice {tm.mode} and {guide.param} both constrain the answer - send one of them",
                "tool_choice",
            )
        guide = tm.guide
    return engine_values(guide, info) if guide is not None else {}


def _tool_calls(tm: Any) -> Any:
    from .tools import ToolCalls

    return ToolCalls(tm) if tm is not None and tm.calls else None


class Generation:
    """The engine's stream for one plan, as text pieces; counts and timings for usage and the log."""

    def __init__(
        self, plan: Plan, triton: Triton, info: ModelInfo, codec: TextCodec, request_id: str, timeout_s: float
    ) -> None:
        self.plan, self.triton, self.info, self.codec = plan, triton, info, codec
        self.request_id, self.timeout_s = request_id, timeout_s
        self.prompt_tokens = len(plan.ids)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None

    async def pieces(self) -> AsyncIterator[Piece]:
        """Text pieces as they become safe to send; finish_reason is set once the stream ends."""
        plan = self.plan
        detok = self.codec.detokenizer()
        stop = StopText(plan.stops)
        req = self.triton.request(self.info, plan.ids, plan.values, self.request_id)
        stream = self.triton.stream(req, self.timeout_s)
        last = None
        try:
            async for delta in stream:
                piece, done = self._step(delta, detok, stop)
                if delta.ids:
                    last = delta.ids[-1]
                if piece is not None:
                    yield piece
                if done:
                    break
        except EngineError as exc:
            raise _api_error(exc) from None
        finally:
            await stream.aclose()
        if self.finish_reason is None:
            at_length = self.completion_tokens >= plan.max_tokens and last not in plan.end_ids
            self.finish_reason = "length" if at_length else "stop"

    def _step(self, delta: Delta, detok, stop: StopText) -> tuple[Piece | None, bool]:
        if delta.num_input_tokens:
            self.prompt_tokens = delta.num_input_tokens
        ids = delta.ids
        text = ""
        if ids:
            now = time.perf_counter()
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
            self.completion_tokens += len(ids)
            text = detok.feed(ids)
        if delta.final:
            text += detok.finish()
        out = stop.feed(text)
        if stop.stopped:
            self.finish_reason = "stop"
            if not out and not (self.plan.logprobs and ids):
                return None, True
            return Piece(out, ids, delta.logprobs if self.plan.logprobs else None), True
        if delta.final:
            out += stop.flush()
        if not out and not (self.plan.logprobs and ids):
            return None, delta.final
        return Piece(out, ids, delta.logprobs if self.plan.logprobs else None), delta.final

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


def _api_error(exc: EngineError) -> ApiError:
    if "DEADLINE_EXCEEDED" in exc.message:
        return ApiError(
            504,
            "The request ran past serving.openai.request_timeout_s and was ended - ask for fewer tokens "
            "or raise the timeout",
            code="timeout",
        )
    if exc.invalid:
        return ApiError(400, f"The engine refused the request: {exc.message}", code="engine_refused")
    return ApiError(
        502, f"The engine failed the request: {exc.message}", code="engine_error", type="server_error"
    )
