"""The gateway's FastAPI application: routes, the fast path per request, streaming and disconnects.

  GET  /v1/models, /v1/models/{id}       the one served model
  POST /v1/completions                   prompt (text or token ids) -> text
  POST /v1/chat/completions              messages through the chat template -> text
  GET  /health/live                      the gateway runs
  GET  /health/ready                     Triton and the `tensorrt_llm` model are ready
  GET  /metrics                          Prometheus text (metrics.py)

A client that disconnects (a stream or a whole answer) cancels its gRPC call, so the engine stops.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from . import errors
from .api_keys import KeyRing
from .errors import ApiError, TooLarge
from .generation import Generation, Piece, end_ids, plan
from .metrics import AccessLog, Metrics
from .middleware import Gate
from .ratelimit import RateLimits
from .responses import DONE, Renderer
from .schemas import ChatCompletionRequest, CompletionRequest, model_mismatch
from .settings import GatewaySettings

log = logging.getLogger("lpx.gateway")
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Gateway:
    """What the routes share; the heavy parts (Triton's channel, the tokenizer) are made at startup."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.keys = KeyRing(settings.api_keys_file)
        self.metrics = Metrics()
        self.access = AccessLog(settings.access_log, settings.log_prompts)
        self.limits = RateLimits(
            settings.rate_limit_storage, settings.requests_per_minute, settings.tokens_per_minute
        )
        self.started = int(time.time())
        self.triton: Any = None
        self.codec: Any = None
        self.ends: list[int] = []

    async def start(self) -> None:
        from .text import TextCodec
        from .triton import Triton

        s = self.settings
        self.codec = TextCodec(s.tokenizer, s.chat_template)
        self.ends = end_ids(self.codec)
        self.triton = Triton(s.triton_url, timeout_s=s.request_timeout_s)
        try:
            await self.model_info()
        except ApiError as exc:
            log.warning("%s (will retry on the first request)", exc.message)
        # The tokenizer's libraries leave a few hundred thousand objects that live as long as the process;
        # frozen, the collector never walks them again (a full collection of them takes 0.4-0.7 s here)
        gc.collect()
        gc.freeze()

    async def stop(self) -> None:
        if self.triton is not None:
            await self.triton.close()
        self.access.close()

    async def model_info(self):
        s = self.settings
        overrides = {
            "max_input_len": s.max_input_len,
            "max_seq_len": s.max_seq_len,
            "max_tokens_cap": s.max_tokens_cap,
        }
        try:
            return await self.triton.info(overrides)
        except Exception as exc:
            raise ApiError(
                503,
                f"The model is not reachable on Triton at {s.triton_url} ({str(exc).splitlines()[0][:200]}) "
                "- is 'lpx serve' running?",
                code="model_not_ready",
            ) from None


def create_app(settings: GatewaySettings) -> Any:
    """The ASGI application inside the Gate middleware (keys, limits, log, metrics): the generation
    routes' POSTs straight to their endpoints, everything else through FastAPI."""
    gw = Gateway(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(
        title="LPX OpenAI gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gw = gw
    errors.install(app)
    _add_routes(app, gw, settings)

    # A POST to one of the two generation routes skips FastAPI's stack (its router and its middleware
    # layers, each a coroutine and often a wrapped send per request) and goes straight to a plain
    # ASGI endpoint that validates the body with pydantic from the JSON bytes and answers its own errors
    # in the same shape; any other method on those paths still gets FastAPI's 405.
    fast = {
        "/v1/completions": GenerationRoute(gw, CompletionRequest, chat=False),
        "/v1/chat/completions": GenerationRoute(gw, ChatCompletionRequest, chat=True),
    }
    for path, endpoint in fast.items():  # registered too, so that FastAPI answers another method's 405
        app.router.add_route(path, endpoint, ["POST"])

    async def dispatch(scope: dict, receive: Any, send: Any) -> None:
        route = fast.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await app(scope, receive, send)
        else:
            await route(scope, receive, send)

    return Gate(
        dispatch,
        gw.keys,
        gw.metrics,
        gw.access,
        settings.open_routes,
        settings.max_body_bytes,
        settings.drain_timeout_s,
    )


def _add_routes(app: FastAPI, gw: Gateway, settings: GatewaySettings) -> None:
    """The routes FastAPI serves: health, metrics and the model list."""

    @app.get("/health/live")
    async def live() -> dict:
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> Response:
        ok, why = await gw.triton.ready()
        if ok:
            await gw.model_info()
            return JSONResponse({"status": "ready", "model": settings.model_name})
        raise ApiError(503, why + " - wait for it to load, or see Triton's log", code="not_ready")

    @app.get("/metrics")
    async def metrics() -> Response:
        body, kind = gw.metrics.render()
        return Response(body, media_type=kind)

    def model_card() -> dict:
        return {"id": settings.model_name, "object": "model", "created": gw.started, "owned_by": "lpx"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        if model_id != settings.model_name:
            raise model_mismatch(model_id, settings.model_name)
        return model_card()


class GenerationRoute:
    """/v1/completions or /v1/chat/completions as an ASGI endpoint."""

    def __init__(self, gw: Gateway, model: type, chat: bool) -> None:
        self.gw, self.model, self.chat = gw, model, chat

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        try:
            response = await generate(self.gw, await _body(request, self.model), request, self.chat)
        except ApiError as exc:
            response = _noted(scope, exc)
        except TooLarge:
            raise  # the Gate answers 413
        except Exception as exc:
            response = _noted(scope, errors.unexpected(exc, scope["path"]))
        await response(scope, receive, send)


def _noted(scope: dict, exc: ApiError) -> Response:
    scope["state"]["lpx"]["error"] = exc.message
    return exc.response()


async def _body(request: Request, model: type) -> Any:
    """The request model from the body: 415 unless it is sent as application/json (checked before it is
    read), 400 for anything that is not a strict JSON object of the model's types (schemas.py), and 499
    when the client leaves while sending it (the access log's one line says so; no traceback)."""
    from starlette.requests import ClientDisconnect

    from .schemas import check_media_type, parse_body

    check_media_type(request.headers.getlist("content-type"))
    try:
        raw = await request.body()
    except ClientDisconnect:
        request.scope["state"]["lpx"]["disconnected"] = True
        raise ApiError(
            499, "The client disconnected while sending the request body", code="client_disconnected"
        ) from None
    return parse_body(raw, model)


async def generate(
    gw: Gateway, body: CompletionRequest | ChatCompletionRequest, request: Request, chat: bool
) -> Any:
    s = gw.settings
    rec = request.scope["state"]["lpx"]
    rec["stream"], rec["model"] = body.stream, body.model
    if body.model != s.model_name:
        raise model_mismatch(body.model, s.model_name)
    key = rec.get("key")
    await gw.limits.admit(key, rec["key_id"])
    info = await gw.model_info()
    job = plan(body, gw.codec, info, gw.ends)
    rec["prompt_tokens"] = len(job.ids)
    if gw.access.log_prompts:
        rec["prompt"] = job.prompt
    await gw.limits.spend(key, rec["key_id"], len(job.ids))
    gen = Generation(job, gw.triton, info, gw.codec, rec["request_id"], s.request_timeout_s)
    render = Renderer(chat, rec["request_id"], s.model_name, gw.codec, body.include_usage)
    render.tools = job.tools
    rec["generated"] = True
    gw.metrics.in_flight.inc()
    pieces = gen.pieces()
    if not body.stream:
        collected: list[Piece] = []

        async def collect() -> None:
            async for piece in pieces:
                collected.append(piece)

        try:
            if not await _until_disconnect(collect(), request.receive):
                rec["disconnected"] = True
                return Response(status_code=499)
            return JSONResponse(render.whole("".join(p.text for p in collected), gen, collected))
        finally:
            await _finish(gw, gen, rec, pieces)
    try:
        first = await pieces.__anext__()  # the engine's refusal is still a proper 4xx status here
    except StopAsyncIteration:
        first = None
    except BaseException:
        await _finish(gw, gen, rec, pieces)
        raise
    return SSEResponse(gw, gen, render, first, pieces, rec)


async def _finish(gw: Gateway, gen: Generation, rec: dict, pieces: Any) -> None:
    """Once per generation request: close the engine stream, count and record."""
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


async def _until_disconnect(work: Any, receive: Any) -> bool:
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


class SSEResponse(Response):
    """A streamed answer (the module docstring of responses.py): written by one coroutine straight from
    the engine's pieces; when the client goes away - also while the engine has not produced the next
    token - the coroutine is cancelled, which closes the gRPC call."""

    def __init__(
        self, gw: Gateway, gen: Generation, render: Renderer, first: Piece | None, pieces: Any, rec: dict
    ):
        super().__init__(status_code=200, media_type="text/event-stream")
        self.gw, self.gen, self.render, self.first, self.pieces, self.rec = (
            gw,
            gen,
            render,
            first,
            pieces,
            rec,
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        # body chunks go to the server's own send: the framework's wrappers only watch the start
        raw = self.rec.get("raw_send") or send
        render, offset = self.render, 0
        head = render.role_chunk() if render.chat else b""
        if self.first is not None:
            head += render.chunk(self.first, offset)
            offset += len(self.first.text)

        async def pump() -> None:
            try:
                await self._write(raw, offset)
            finally:
                await _finish(self.gw, self.gen, self.rec, self.pieces)

        try:
            if head:  # the first token goes out at once, before the tasks below are started
                await raw({"type": "http.response.body", "body": head, "more_body": True})
            ended = await _until_disconnect(pump(), receive)
        except OSError:  # the socket closed under a send
            ended = False
        if not ended:
            self.rec["disconnected"] = True
            await _finish(self.gw, self.gen, self.rec, self.pieces)  # (once: a no-op after pump's)

    async def _write(self, send: Any, offset: int) -> None:
        render, body = self.render, "http.response.body"
        try:
            async for piece in self.pieces:
                await send({"type": body, "body": render.chunk(piece, offset), "more_body": True})
                offset += len(piece.text)
        except ApiError as exc:
            self.rec["error"] = exc.message
            await send({"type": body, "body": render.error_event(exc.body()) + DONE, "more_body": False})
            self.rec["complete"] = True  # (no await between: a drain cannot end it a second time)
            return
        tail = render.finish_chunk(self.gen.finish_reason or "stop")
        if render.include_usage:
            tail += render.usage_chunk(self.gen)
        await send({"type": body, "body": tail + DONE, "more_body": False})
        self.rec["complete"] = True
