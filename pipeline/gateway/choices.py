"""The choices of one request: a list of prompts and / or n > 1 is one engine request per choice
(plan.plans), run concurrently; their pieces come out merged as they are produced, each tagged with
its choice's index, and a marker piece (`finish` set, no text) ends each choice, so a stream interleaves
the choices by index as OpenAI's does. Usage adds up: prompt tokens once per prompt, completion tokens of
every choice. Completions' echo is the first piece of its choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .generation import Generation, Piece

_END = object()


class Choices:
    """The generations of one request; `n` samples per prompt (so every n-th counts the prompt)."""

    def __init__(self, gens: list[Generation], n: int = 1) -> None:
        self.gens, self.n = gens, max(1, n)
        self.plan = gens[0].plan  # what the renderer reads (logprobs asked, alternatives)
        self._tasks: list[asyncio.Task] = []

    # -- what the access log, the limits and usage read ---------------------------------------
    @property
    def prompt_tokens(self) -> int:
        return sum(g.prompt_tokens for g in self.gens[:: self.n])

    @property
    def completion_tokens(self) -> int:
        return sum(g.completion_tokens for g in self.gens)

    @property
    def finish_reason(self) -> str | None:
        reasons = [g.finish_reason for g in self.gens if g.finish_reason]
        if not reasons:
            return None
        return reasons[0] if len(set(reasons)) == 1 else ",".join(sorted(set(reasons)))

    @property
    def first_token_at(self) -> float | None:
        return min((g.first_token_at for g in self.gens if g.first_token_at is not None), default=None)

    @property
    def last_token_at(self) -> float | None:
        return max((g.last_token_at for g in self.gens if g.last_token_at is not None), default=None)

    def usage(self) -> dict[str, int]:
        prompt, completion = self.prompt_tokens, self.completion_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    # -- the pieces ---------------------------------------------------------------------------
    async def pieces(self) -> AsyncIterator[Piece]:
        """Every choice's pieces as they come, each choice ended by its marker."""
        if len(self.gens) == 1:
            async for piece in _one(self.gens[0]):
                yield piece
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(gen: Generation) -> None:
            try:
                async for piece in _one(gen):
                    await queue.put(piece)
            except BaseException as exc:  # the first error ends the request (a 4xx / 5xx or an error event)
                await queue.put(exc)
                raise
            finally:
                await queue.put(_END)

        self._tasks = [asyncio.ensure_future(pump(g)) for g in self.gens]
        try:
            running = len(self._tasks)
            while running:
                item = await queue.get()
                if item is _END:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _one(gen: Generation) -> AsyncIterator[Piece]:
    index = gen.plan.index
    if gen.plan.echo:
        yield Piece(gen.plan.echo, index=index)
    pieces = gen.pieces()
    try:
        async for piece in pieces:
            yield piece
    finally:
        await pieces.aclose()
    yield Piece("", index=index, finish=gen.finish_reason or "stop")
