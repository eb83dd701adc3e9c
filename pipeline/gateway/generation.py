"""One request on the fast path: prompt ids and engine inputs from an OpenAI body (`plan`), then the
engine's token stream turned into text pieces with stop sequences and exact counts (`Generation`).

Lengths follow the engine: a prompt above max_input_len, or prompt + max_tokens above max_seq_len, is a
400 with the numbers; without max_tokens a completion gets 16 tokens (OpenAI's and vLLM's default) and a
chat what remains of max_seq_len, both capped by serving.max_tokens_cap and the room left. Sampling maps
onto upstream's inputs (temperature, runtime_top_p, runtime_top_k, seed, presence / frequency /
repetition penalty, min_tokens; ignore_eos as min_tokens = max_tokens); a value the served model does not
declare is refused unless it is the default. A request of several prompts and / or n > 1 is one plan per
choice (choice index = prompt index x n + sample), each an independent engine request; with a seed,
sample i gets seed + i, so the choices differ and each reproduces. completion_tokens counts every id the engine generated for the answer, the end-of-sequence id
included, up to the one that completed a stop sequence.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ApiError, bad_request
from .schemas import ChatCompletionRequest, CompletionRequest
from .text import StopText, TextCodec, prompt_ids
from .triton import TOP_INPUT, Delta, EngineError, ModelInfo, Triton

DEFAULT_WITHOUT_LIMITS = 16  # max_tokens when neither max_seq_len nor max_tokens_cap is known
COMPLETIONS_DEFAULT = 16  # /v1/completions' max_tokens when absent (OpenAI's and vLLM's)
UINT64 = 2**64


@dataclass
class Plan:
    ids: list[int]
    max_tokens: int
    values: dict[str, Any]  # engine inputs besides input_ids
    stops: list[str]
    logprobs: bool
    end_ids: frozenset[int]
    prompt: Any = None  # for the access log when prompts are logged
    index: int = 0  # the choice's index
    echo: str = ""  # completions' echo: the prompt's text, sent before the answer
    top_logprobs: int = 0  # alternatives per token (0: the sampled token's only)
    tools: Any = None  # tools.ToolCalls when the answer may be tool calls (one per choice: it keeps state)


@dataclass
class Piece:
    """Text ready to send, with the log probabilities of the tokens behind it (when asked)."""

    text: str
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    index: int = 0  # the choice it belongs to
    finish: str | None = None  # set on the marker that ends a choice (choices.py), its text empty
    top: list[list[tuple[int, float]]] | None = None  # per token: (id, log prob) alternatives


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
        "seed": (None if req.seed is None else req.seed % UINT64, "seed", req.seed is not None),
        "presence_penalty": (req.presence_penalty, "presence_penalty", bool(req.presence_penalty)),
        "frequency_penalty": (req.frequency_penalty, "frequency_penalty", bool(req.frequency_penalty)),
        "repetition_penalty": (
            req.repetition_penalty,
            "repetition_penalty",
            req.repetition_penalty not in (None, 1.0),
        ),
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


def plans(
    req: CompletionRequest | ChatCompletionRequest, codec: TextCodec, info: ModelInfo, ends: list[int]
) -> list[Plan]:
    """Check and translate one request into one plan per choice (400 for anything the gateway or the
    engine would refuse)."""
    req.refuse()
    n = req.n or 1
    if isinstance(req, ChatCompletionRequest):
        tm, messages, ids = _chat_prompt(req, codec)
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        first = plan_one(req, ids, messages, req.asked_tokens(), param, info, None, codec.vocab_size, tm)
        firsts = [first]
    else:
        firsts = []
        for prompt in req.prompts():
            ids = prompt_ids(codec, prompt)
            echo = (prompt if isinstance(prompt, str) else codec.decode(ids)) if req.echo else ""
            one = plan_one(
                req, ids, prompt, req.max_tokens, "max_tokens", info, COMPLETIONS_DEFAULT, codec.vocab_size
            )
            one.echo = echo
            firsts.append(one)
    out = []
    for first in firsts:
        for sample in range(n):
            values = dict(first.values)
            if sample and "seed" in values:
                values["seed"] = (values["seed"] + sample) % UINT64
            index = len(out)
            calls = _tool_calls(first.tools.tm) if first.tools is not None else None
            out.append(replace(first, values=values, index=index, tools=calls))
    if ends:
        for one in out:
            one.values["end_id"] = ends[0]
            pad = codec.tokenizer.pad_token_id
            one.values["pad_id"] = pad if isinstance(pad, int) else ends[0]
            one.end_ids = frozenset(ends)
    return out


def _logprobs_asked(req: CompletionRequest | ChatCompletionRequest, info: ModelInfo) -> tuple[bool, int]:
    """(the sampled tokens' log probs asked, alternatives per token); refused where the engine lacks them."""
    if isinstance(req, ChatCompletionRequest):
        asked, k, param = bool(req.logprobs), req.top_logprobs or 0, "top_logprobs"
    else:
        asked, k, param = req.logprobs is not None, req.logprobs or 0, "logprobs"
    if asked and not info.log_probs:
        raise bad_request(
            "logprobs are not available: the served model declares no output_log_probs - leave logprobs out",
            "logprobs",
        )
    if k and not info.top_log_probs:
        raise bad_request(
            f"{param} = {k} asks for alternatives: the served engine ({info.target}) returns only the "
            f"sampled token's log probability - send {param} 0 (the torch, llmapi and vllm targets return them)",
            param,
        )
    return asked, k


def plan_one(
    req: CompletionRequest | ChatCompletionRequest,
    ids: list[int],
    prompt: Any,
    asked: int | None,
    param: str,
    info: ModelInfo,
    default: int | None = None,
    vocab: int = 0,
    tm: Any = None,
) -> Plan:
    """One prompt's plan (choice 0); `default`: max_tokens when absent (None: what remains); `tm`: the
    chat request's tools.ToolMode (its guide constrains the answer; its calls are parsed from it)."""
    if not ids:
        raise bad_request("The prompt is empty after tokenization - send some text", "prompt")
    if asked is None and default is not None:  # the default, within the cap and the room left
        room = info.max_seq_len - len(ids) if info.max_seq_len else 0
        asked = min(x for x in (default, info.max_tokens_cap, room) if x > 0) if room >= 0 else None
    max_tokens = max_tokens_for(asked, len(ids), info, param)
    logprobs, k = _logprobs_asked(req, info)
    values: dict[str, Any] = {
        "input_lengths": len(ids),
        "request_output_len": max_tokens,
        "streaming": True,
        "exclude_input_in_output": True,
        "return_num_input_tokens": True,
        **_sampling(req, info, vocab),
    }
    min_tokens = req.min_tokens_for(max_tokens)
    if min_tokens:
        if "min_tokens" not in info.inputs:
            name = "ignore_eos" if req.ignore_eos else "min_tokens"
            raise bad_request(f"{name} is not taken by the served model (no min_tokens input)", name)
        values["min_tokens"] = min_tokens
    if logprobs:
        values["return_log_probs"] = True
    if k:
        values[TOP_INPUT] = k
    values.update(_guided(req, tm, info))
    if min_tokens and "guided_decoding_guide_type" in values:
        name = "ignore_eos" if req.ignore_eos else "min_tokens"
        raise bad_request(
            f"{name} cannot be combined with structured output or a required tool call: once the answer is "
            f"complete the grammar allows only the end of text, which {name} forbids - leave {name} out",
            name,
        )
    return Plan(
        ids,
        max_tokens,
        values,
        req.stops(),
        logprobs,
        frozenset(),
        prompt,
        top_logprobs=k,
        tools=_tool_calls(tm),
    )


def _chat_prompt(req: ChatCompletionRequest, codec: TextCodec) -> tuple[Any, list[dict[str, Any]], list[int]]:
    """(tools.ToolMode, the messages as the template takes them, the prompt ids)."""
    from . import tools

    tm = tools.tool_mode(req, tools.parser_for(codec))
    tools.check_template(tm, codec.reads_tools)
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
            return self._piece(out, ids, delta), True
        if delta.final:
            out += stop.flush()
        if not out and not (self.plan.logprobs and ids):
            return None, delta.final
        return self._piece(out, ids, delta), delta.final

    def _piece(self, text: str, ids: list[int], delta: Delta) -> Piece:
        lp = delta.logprobs if self.plan.logprobs else None
        top = delta.top if self.plan.top_logprobs else None
        return Piece(text, ids, lp, self.plan.index, top=top)

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
