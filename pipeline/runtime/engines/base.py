"""What LPX's two engines (torch_engine, llmapi_engine) share: the token-delta stream `submit` returns,
TensorRT-LLM's request rules (prompt and length limits, when sampling is greedy) and the blocking
`generate` over a stream."""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ... import trace
from ...errors import LpxError
from ..limits import Limits, input_refusal, max_tokens_refusal

# Request options (pipeline/runtime/validate.py's names) an engine may honour beyond the defaults, as
# engine_model.py passes them to submit(); the llmapi and vllm engines honour all of them (SamplingParams)
ENGINE_OPTIONS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "return_log_probs",
    "top_log_probs_k",
)
DONE = object()  # queue sentinel: the request ended without a final output (cancelled, engine closed)


class DeltaStream:
    """Token deltas of one request. Iterate it; `finished` turns true with the last delta.

    The engine's thread puts on `queue`: (every token generated so far, finished[, their log probs[,
    their top-k alternatives]]) tuples, an Exception (raised to the reader), or DONE. `tokens` holds
    everything read so far, `logprobs` their log probs when the request asked for them (else None), and
    `top` per token the k best (ids, log probs) when it asked for alternatives (else None)."""

    def __init__(self, request_id: str, on_cancel: Callable[[DeltaStream], None]) -> None:
        self.request_id = request_id
        self.finished = False
        self.tokens: list[int] = []
        self.logprobs: list[float] | None = None
        self.top: list[tuple[list[int], list[float]]] | None = None
        self.queue: queue.Queue = queue.Queue()
        self.result: Any = None  # the engine's own handle of the request (llmapi: the result to abort)
        self._on_cancel = on_cancel

    def __iter__(self) -> DeltaStream:
        return self

    def __next__(self) -> list[int]:
        if self.finished:
            raise StopIteration
        item = self.queue.get()
        if item is DONE:
            self.finished = True
            raise StopIteration
        if isinstance(item, Exception):
            self.finished = True
            raise item
        generated, done, *logprobs = item
        if logprobs and self.logprobs is not None:
            self.logprobs = list(logprobs[0])
        if len(logprobs) > 1 and logprobs[1] is not None and self.top is not None:
            self.top = list(logprobs[1])
        delta = generated[len(self.tokens) :]
        self.tokens = list(generated)
        self.finished = done
        if trace.ON:  # the request's thread took the delta off the engine's queue
            trace.mark("taken", id=self.request_id, n=len(self.tokens))
        return delta

    def cancel(self) -> None:
        """Stop the request; the stream ends (without an error) at the next read."""
        self._on_cancel(self)


def greedy(temperature: float, top_k: int, top_p: float) -> bool:
    """TensorRT-LLM's rule: greedy when temperature is 0, top_k is 1, or neither top_k nor top_p is set."""
    return temperature <= 0 or top_k == 1 or (top_k <= 0 and top_p <= 0)


@dataclass
class Request:
    """One generation request, checked: prompt token ids, how many new tokens at most, the ids that end
    it (None: the model's own), and sampling with TensorRT-LLM's meaning (see `greedy`)."""

    input_ids: list[int]
    max_new_tokens: int
    end_ids: list[int] | None
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    options: dict = field(default_factory=dict)  # features in the engine's SUPPORTED, non-default only


class Engine(ABC):
    """What both engines share: `submit` checks a request and hands it to the subclass's `start`."""

    # Request features (pipeline/runtime/validate.py's names) this engine honours beyond the defaults;
    # the Triton model refuses a non-default value of any other with INVALID_ARG.
    SUPPORTED: frozenset[str] = frozenset()

    max_input_len: int = 0  # 0: no limit known
    max_seq_len: int = 0
    # start() only hands the request on (no grammar compile, no wait): the Triton model submits it from
    # execute() itself, before the request's thread starts (engine_model.py), so the thread's start is
    # off the way to the first token
    QUICK_START: bool = False

    def check_prompt(self, input_ids, max_new_tokens: int) -> list[int]:
        """The prompt as ints, refused when empty or beyond the engine's limits (a LpxError naming the fix)."""
        input_ids = [int(t) for t in input_ids]
        if not input_ids:
            raise LpxError("Empty prompt: send at least one token")
        if max_new_tokens < 1:
            raise LpxError(
                f"max_tokens must be at least 1 (got {max_new_tokens}) - ask for at least one token"
            )
        limits = Limits(max_input_len=self.max_input_len, max_seq_len=self.max_seq_len)
        refusal = input_refusal(len(input_ids), limits) or max_tokens_refusal(
            "max_tokens", max_new_tokens, limits, len(input_ids)
        )
        if refusal:  # the same checks and messages as the gateway's and the models' validation
            raise LpxError(refusal.message)
        return input_ids

    def submit(
        self,
        input_ids: list[int],
        max_new_tokens: int,
        end_ids: list[int] | None = None,
        temperature: float = 0.0,
        top_k: int = 1,
        top_p: float = 0.0,
        seed: int | None = None,
        **options: Any,
    ) -> DeltaStream:
        """Queue one request; returns its stream of token deltas. A request the engine cannot run (closed
        engine, empty or too long prompt, max_tokens beyond max_seq_len, an option it does not honour) is
        a LpxError naming the fix."""
        self.check_open()
        ids = self.check_prompt(input_ids, max_new_tokens)
        ends = [int(e) for e in end_ids] if end_ids else None
        seed = None if seed is None else int(seed)
        unknown = sorted(set(options) - self.SUPPORTED)
        if unknown:
            raise LpxError(
                f"{', '.join(unknown)} not supported by this engine - leave them at their defaults"
            )
        return self.start(
            Request(
                ids, int(max_new_tokens), ends, float(temperature), int(top_k), float(top_p), seed, options
            )
        )

    def check_open(self) -> None:
        """Refuse a request when the engine cannot take one (closed, or its worker died); by default an
        engine is always open."""
        return None

    def iteration_stats(self) -> dict[str, Any] | None:
        """The engine's latest state as one TensorRT-LLM IterationStats dict (numActiveRequests, kvCacheStats,
        inflightBatchingStats, ...), for the backend's metric families (runtime/trtllm_metrics.py); None
        while it has none to give."""
        return None

    @abstractmethod
    def start(self, request: Request) -> DeltaStream:
        """Hand a checked request to the engine; returns its stream."""

    def generate(self, input_ids: list[int], max_new_tokens: int, **kwargs: Any) -> list[int]:
        """All new tokens of one request (blocking)."""
        stream = self.submit(input_ids, max_new_tokens, **kwargs)
        for _ in stream:
            pass
        return stream.tokens

    @abstractmethod
    def close(self) -> None:
        """Stop the engine and end every open stream."""

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
