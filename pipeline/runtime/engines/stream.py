"""The token-delta stream both of LPX's engines return from `submit` (torch_engine, llmapi_engine)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

DONE = object()  # queue sentinel: the request ended without a final output (cancelled, engine closed)


class DeltaStream:
    """Token deltas of one request. Iterate it; `finished` turns true with the last delta.

    The engine's thread puts on `queue`: (every token generated so far, finished) tuples, an
    Exception (raised to the reader), or DONE. `tokens` holds everything read so far."""

    def __init__(self, request_id: str, on_cancel: Callable[[DeltaStream], None]) -> None:
        self.request_id = request_id
        self.finished = False
        self.tokens: list[int] = []
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
        generated, done = item
        delta = generated[len(self.tokens) :]
        self.tokens = list(generated)
        self.finished = done
        return delta

    def cancel(self) -> None:
        """Stop the request; the stream ends (without an error) at the next read."""
        self._on_cancel(self)
