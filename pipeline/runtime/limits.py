"""The engine's length limits and each one's single check and message, shared by the gateway (its 400s)
and the models' validation layer (validate.py: Triton's INVALID_ARG for direct clients).

`Limits` is what the serving engine allows: max_input_len and max_seq_len from the build, max_tokens_cap
from serving.max_tokens_cap (the repository's model parameters record all three). Each check returns a
`Refusal` - the message with its fix after ' - ', the input it is about, and whether the context is what
does not fit (OpenAI's code context_length_exceeded) - or None; the caller raises it its own way. The
figure is `max_tokens` throughout (the engine's request_output_len); `sent` is the name the client used
for it (max_tokens, max_completion_tokens, request_output_len, min_length ...). Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def show(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e18 else repr(v)


@dataclass(frozen=True)
class Limits:
    """What the serving engine allows. 0 / None: not known here, so not checked."""

    vocab_size: int | None = None
    max_input_len: int = 0
    max_seq_len: int = 0
    max_tokens_cap: int = 0
    max_beam_width: int = 0  # 0: not known here (the engine checks)
    target: str = "torch"
    supported: frozenset[str] = field(default_factory=frozenset)  # non-default values the target honours


@dataclass(frozen=True)
class Refusal:
    """Why one limit refuses a request: the message (its fix after ' - '), the input it is about, and
    whether the context is what does not fit (the gateway's code context_length_exceeded)."""

    message: str
    param: str
    context: bool = False


def input_refusal(n_prompt: int, limits: Limits) -> Refusal | None:
    """The prompt above the engine's max_input_len."""
    if limits.max_input_len and n_prompt > limits.max_input_len:
        return Refusal(
            f"The prompt has {n_prompt} tokens, above the engine's max_input_len {limits.max_input_len} - "
            "shorten it or rebuild with a larger build.max_input_len",
            "prompt",
            context=True,
        )
    return None


def room_refusal(n_prompt: int, limits: Limits) -> Refusal | None:
    """A prompt that leaves no token below the engine's max_seq_len."""
    if limits.max_seq_len and n_prompt >= limits.max_seq_len:
        return Refusal(
            f"The prompt has {n_prompt} tokens, leaving no room below the engine's max_seq_len "
            f"{limits.max_seq_len} - shorten it",
            "prompt",
            context=True,
        )
    return None


def max_tokens_refusal(sent: str, v: float, limits: Limits, n_prompt: int | None = None) -> Refusal | None:
    """A max_tokens `v` (sent as `sent`) above serving.max_tokens_cap, or past max_seq_len with the prompt."""
    cap, seq = limits.max_tokens_cap, limits.max_seq_len
    if cap and v > cap:
        return Refusal(
            f"{sent} {show(v)} is above this server's cap {cap} - ask for at most {cap} tokens, or raise "
            f"the limit of {cap} (serving.max_tokens_cap)",
            sent,
        )
    if n_prompt is not None and seq and n_prompt + v > seq:
        return Refusal(
            f"The prompt ({n_prompt} tokens) + {sent} ({show(v)}) = {show(n_prompt + v)} tokens is above "
            f"the engine's max_seq_len {seq} - ask for at most {max(seq - n_prompt, 0)} tokens, shorten the "
            "prompt, or rebuild with a larger build.max_seq_len",
            sent,
            context=True,
        )
    return None


def min_tokens_refusal(sent: str, v: float, max_tokens: int) -> Refusal | None:
    """A min_tokens `v` (sent as `sent`) above max_tokens."""
    if v > max_tokens:
        return Refusal(
            f"{sent} {show(v)} is above max_tokens {max_tokens}: the engine cannot generate more than "
            "max_tokens - send at most max_tokens",
            sent,
        )
    return None
