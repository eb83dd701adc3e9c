"""One plan run (plan.py makes it): the engine's token stream for one choice turned into text pieces with
stop sequences and exact counts (`Generation`). completion_tokens counts every id the engine generated
for the answer, the end-of-sequence id included, up to the one that completed a stop sequence; the answer
ended at the plan's max_tokens without an end id is finish_reason "length".
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .plan import Plan
from .text import StopText, TextCodec
from .triton import Delta, EngineError, ModelInfo, Triton


@dataclass
class Piece:
    """Text ready to send, with the log probabilities of the tokens behind it (when asked)."""

    text: str
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    index: int = 0  # the choice it belongs to
    finish: str | None = None  # set on the marker that ends a choice (choices.py), its text empty
    top: list[list[tuple[int, float]]] | None = None  # per token: (id, log prob) alternatives


class Generation:
    """The engine's stream for one plan, as text pieces; counts and timings for usage and the log."""

    def __init__(
        self, plan: Plan, triton: Triton, info: ModelInfo, codec: TextCodec, request_id: str, timeout_s: float
    ) -> None:
        self.plan, self.triton, self.info, self.codec = plan, triton, info, codec
        self.request_id, self.timeout_s = request_id, timeout_s
        self.tools = _tool_calls(plan.tools)  # the answer's tool calls, parsed as it streams (or None)
        self.end_ids = frozenset(plan.end_ids)
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
        req = self.triton.request(self.info, plan.ids, plan.inputs(), self.request_id)
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
            at_length = self.completion_tokens >= plan.max_tokens and last not in self.end_ids
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


def _tool_calls(tm: Any) -> Any:
    """One choice's tools.ToolCalls (it keeps the parse's state) for a plan whose answer may be calls."""
    from .tools import ToolCalls

    return ToolCalls(tm) if tm is not None else None


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
