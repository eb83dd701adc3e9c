"""One request turned into its plan before anything runs: what each choice asks the engine for (`Plan`),
with every refusal (400) decided here; generation.py runs a plan.

Lengths follow the engine (pipeline/runtime/limits.py holds each limit's one check and message; the
limits come from the served repository's model parameters, ModelInfo): a prompt above max_input_len, or
prompt + max_tokens above max_seq_len, is a 400 with the numbers; without max_tokens a completion gets 16
tokens (OpenAI's and vLLM's default) and a chat what remains of max_seq_len, both capped by
serving.max_tokens_cap and the room left. The figure is `max_tokens` from the body to the plan; the
engine's input is request_output_len (Plan.inputs). Sampling maps onto upstream's inputs (temperature,
runtime_top_p, runtime_top_k, seed, presence / frequency / repetition penalty, min_tokens; ignore_eos as
min_tokens = max_tokens); a value the served model does not declare is refused unless it is the default.
A request of several prompts and / or n > 1 is one plan per choice (choice index = prompt index x n +
sample), each an independent engine request; with a seed, sample i gets seed + i, so the choices differ
and each reproduces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..runtime import limits as lim
from .errors import ApiError, bad_request
from .schemas import ChatCompletionRequest, CompletionRequest
from .text import TextCodec, prompt_ids
from .triton import TOP_INPUT, ModelInfo

DEFAULT_WITHOUT_LIMITS = 16  # max_tokens when neither max_seq_len nor max_tokens_cap is known
COMPLETIONS_DEFAULT = 16  # /v1/completions' max_tokens when absent (OpenAI's and vLLM's)
UINT64 = 2**64
NONE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Plan:
    """One choice's request, decided: the engine runs it as is (`inputs()`), nothing in it is refused later
    by the gateway. New request features (a LoRA adapter, KV-cache reuse, speculative decoding) are fields
    here, each turned into its engine inputs by `inputs()`."""

    route: str  # "chat" (/v1/chat/completions, /v1/responses) or "completion"
    ids: list[int]  # the prompt's token ids (not copied: nothing changes them)
    max_tokens: int  # the answer's limit: the engine's request_output_len
    min_tokens: int = 0  # the end ids held back until then (ignore_eos: max_tokens)
    # engine inputs: temperature, runtime_top_p / _top_k, seed, the penalties
    sampling: Mapping[str, Any] = field(default_factory=lambda: NONE)
    # guided-decoding inputs: structured output or a required / named tool call
    guide: Mapping[str, Any] = field(default_factory=lambda: NONE)
    tools: Any = None  # tools.ToolMode whose calls the answer is parsed into (None: plain text)
    stops: tuple[str, ...] = ()
    logprobs: bool = False  # the sampled tokens' log probabilities
    top_logprobs: int = 0  # alternatives per token (0: the sampled token's only)
    end_ids: tuple[int, ...] = ()  # the ids that end an answer (the first is sent as end_id)
    pad_id: int | None = None
    prompt: Any = None  # for the access log when prompts are logged
    index: int = 0  # the choice's index
    echo: str = ""  # completions' echo: the prompt's text, sent before the answer

    def inputs(self) -> dict[str, Any]:
        """The engine inputs besides input_ids (triton.py sends those the model declares)."""
        values: dict[str, Any] = {
            "input_lengths": len(self.ids),
            "request_output_len": self.max_tokens,
            "streaming": True,
            "exclude_input_in_output": True,
            "return_num_input_tokens": True,
            **self.sampling,
        }
        if self.min_tokens:
            values["min_tokens"] = self.min_tokens
        if self.logprobs:
            values["return_log_probs"] = True
        if self.top_logprobs:
            values[TOP_INPUT] = self.top_logprobs
        values.update(self.guide)
        if self.end_ids:
            values["end_id"] = self.end_ids[0]
            values["pad_id"] = self.pad_id
        return values


def end_ids(codec: TextCodec) -> list[int]:
    """The ids that end an answer: the tokenizer's EOS, then generation_config.json's (an int or a list)."""
    from ..runtime.model_args import eos_ids_in

    eos = codec.tokenizer.eos_token_id
    found = ([eos] if isinstance(eos, int) else []) + eos_ids_in(codec.folder, "generation_config.json")
    return list(dict.fromkeys(found))


def plans(
    req: CompletionRequest | ChatCompletionRequest, codec: TextCodec, info: ModelInfo, ends: list[int]
) -> list[Plan]:
    """Check and translate one request into one plan per choice (400 for anything the gateway or the
    engine would refuse)."""
    req.refuse()
    if isinstance(req, ChatCompletionRequest):
        tm, messages, ids = _chat_prompt(req, codec)
        firsts = [plan_one(req, ids, messages, info, None, codec.vocab_size, tm)]
    else:
        firsts = []
        for prompt in req.prompts():
            ids = prompt_ids(codec, prompt)
            echo = (prompt if isinstance(prompt, str) else codec.decode(ids)) if req.echo else ""
            one = plan_one(req, ids, prompt, info, COMPLETIONS_DEFAULT, codec.vocab_size)
            firsts.append(replace(one, echo=echo))
    pad = codec.tokenizer.pad_token_id
    ended = {"end_ids": tuple(ends), "pad_id": pad if isinstance(pad, int) else ends[0]} if ends else {}
    out: list[Plan] = []
    for first in firsts:
        for sample in range(req.n or 1):
            sampling = first.sampling
            if sample and "seed" in sampling:
                sampling = MappingProxyType({**sampling, "seed": (sampling["seed"] + sample) % UINT64})
            out.append(replace(first, sampling=sampling, index=len(out), **ended))
    return out


def plan_one(
    req: CompletionRequest | ChatCompletionRequest,
    ids: list[int],
    prompt: Any,
    info: ModelInfo,
    default: int | None = None,
    vocab: int = 0,
    tm: Any = None,
) -> Plan:
    """One prompt's plan (choice 0); `default`: max_tokens when absent (None: what remains); `tm`: the
    chat request's tools.ToolMode (its guide constrains the answer; its calls are parsed from it)."""
    if not ids:
        raise bad_request("The prompt is empty after tokenization - send some text", "prompt")
    sent, max_tokens = req.sent_max_tokens()
    max_tokens = max_tokens_for(max_tokens, len(ids), info, sent, default)
    logprobs, k = _logprobs_asked(req, info)
    sampling = _sampling(req, info, vocab)
    min_tokens = _min_tokens(req, max_tokens, info)
    guide = _guided(req, tm, info)
    if min_tokens and "guided_decoding_guide_type" in guide:
        name = "ignore_eos" if req.ignore_eos else "min_tokens"
        raise bad_request(
            f"{name} cannot be combined with structured output or a required tool call: once the answer is "
            f"complete the grammar allows only the end of text, which {name} forbids - leave {name} out",
            name,
        )
    return Plan(
        route="chat" if isinstance(req, ChatCompletionRequest) else "completion",
        ids=ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        sampling=MappingProxyType(sampling),
        guide=MappingProxyType(guide),
        tools=tm if tm is not None and tm.calls else None,
        stops=tuple(req.stops()),
        logprobs=logprobs,
        top_logprobs=k,
        prompt=prompt,
    )


def max_tokens_for(
    max_tokens: int | None, n_prompt: int, info: ModelInfo, sent: str, default: int | None = None
) -> int:
    """The answer's max_tokens: as sent (`sent`: the parameter's name), else `default` or what remains of
    max_seq_len, within serving.max_tokens_cap and the room the prompt leaves; a 400 where a limit refuses
    (limits.py)."""
    limits = info.limits
    refusal = lim.input_refusal(n_prompt, limits)
    if refusal is not None:  # (a chat that names max_completion_tokens: its param is the messages)
        raise _refused(refusal, "messages" if sent == "max_completion_tokens" else refusal.param)
    refusal = lim.room_refusal(n_prompt, limits)
    if refusal is not None:
        raise _refused(refusal, refusal.param)
    if max_tokens is None:
        room = limits.max_seq_len - n_prompt if limits.max_seq_len else 0
        known = [x for x in (default, limits.max_tokens_cap, room) if x]
        return min(known) if known else DEFAULT_WITHOUT_LIMITS
    refusal = lim.max_tokens_refusal(sent, max_tokens, limits, n_prompt)
    if refusal is not None:
        raise _refused(refusal, refusal.param)
    return max_tokens


def _refused(refusal: lim.Refusal, param: str) -> ApiError:
    return bad_request(refusal.message, param, code="context_length_exceeded" if refusal.context else None)


def _min_tokens(req: CompletionRequest | ChatCompletionRequest, max_tokens: int, info: ModelInfo) -> int:
    """The engine's min_tokens: ignore_eos runs to max_tokens (the end ids cannot be chosen before)."""
    name = "ignore_eos" if req.ignore_eos else "min_tokens"
    if req.ignore_eos:
        min_tokens = max_tokens
    else:
        refusal = lim.min_tokens_refusal("min_tokens", req.min_tokens or 0, max_tokens)
        if refusal is not None:
            raise _refused(refusal, refusal.param)
        min_tokens = req.min_tokens or 0
    if min_tokens and "min_tokens" not in info.inputs:
        raise bad_request(f"{name} is not taken by the served model (no min_tokens input)", name)
    return min_tokens


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
