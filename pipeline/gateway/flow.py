"""One generation request's course, shared by the chat / completions routes (app.py) and /v1/responses
(responses_api.py): admit it and start its choices, collect a whole answer, run work until the client
disconnects, and finish once (engine streams closed, counts recorded, tokens spent).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from .choices import Choices
from .generation import Generation, Piece
from .plan import plans
from .schemas import model_mismatch


async def start_choices(gw: Any, body: Any, request: Request) -> Choices:
    """Admit one generation request and start its choices (not yet read): the model checked, the rate
    limits admitted and spent on the prompt tokens, one engine request per choice."""
    s = gw.settings
    rec = request.scope["state"]["lpx"]
    rec["stream"], rec["model"] = body.stream, body.model
    if body.model != s.model_name:
        raise model_mismatch(body.model, s.model_name)
    key = rec.get("key")
    await gw.limits.admit(key, rec["key_id"])
    info = await gw.model_info()
    jobs = plans(body, gw.codec, info, gw.ends)
    n = getattr(body, "n", None) or 1
    prompt_tokens = sum(len(job.ids) for job in jobs[::n])
    rec["prompt_tokens"] = prompt_tokens
    if gw.access.log_prompts:
        rec["prompt"] = jobs[0].prompt if len(jobs) == 1 else [job.prompt for job in jobs[::n]]
    await gw.limits.spend(key, rec["key_id"], prompt_tokens)
    rid = rec["request_id"]
    gens = [
        Generation(
            job, gw.triton, info, gw.codec, rid if len(jobs) == 1 else f"{rid}-{i}", s.request_timeout_s
        )
        for i, job in enumerate(jobs)
    ]
    rec["generated"] = True
    gw.metrics.in_flight.inc()
    return Choices(gens, n)


async def collect_all(gw: Any, gen: Choices, rec: dict, pieces: Any, request: Request) -> list | None:
    """Every piece of a whole answer; None when the client left first (the record says so)."""
    collected: list[Piece] = []

    async def collect() -> None:
        async for piece in pieces:
            collected.append(piece)

    try:
        if not await until_disconnect(collect(), request.receive):
            rec["disconnected"] = True
            return None
        return collected
    finally:
        await finish(gw, gen, rec, pieces)


async def finish(gw: Any, gen: Choices, rec: dict, pieces: Any) -> None:
    """Once per generation request: close the engine streams, count and record."""
    if rec.get("finished"):
        return
    rec["finished"] = True
    try:
        await pieces.aclose()
    finally:
        gw.metrics.in_flight.dec()
        rec.update(
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            finish_reason=gen.finish_reason,
            first_token_at=gen.first_token_at,
            last_token_at=gen.last_token_at,
        )
        await gw.limits.spend(rec.get("key"), rec["key_id"], gen.completion_tokens)


async def until_disconnect(work: Any, receive: Any) -> bool:
    """Run `work` unless the client disconnects first (then cancel it); True if it ran to the end."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # we were cancelled ourselves (the drain ran out): so is the work,
        listener.cancel()  # and its cleanup (the gRPC call closed, the record filled) ends before the answer
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    listener.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    task.result()  # re-raise its error
    return True


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
