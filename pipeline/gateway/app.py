"""The gateway's FastAPI application: routes, the fast path per request, streaming and disconnects.

  GET  /v1/models, /v1/models/{id}       the one served model
  POST /v1/completions                   prompt(s) (text or token ids) -> text, n choices each
  POST /v1/chat/completions              messages through the chat template -> text, n choices
  POST /v1/responses                     OpenAI's Responses API for text (responses_api.py)
  GET  /health/live                      the gateway runs
  GET  /health/ready, /health            Triton and the `tensorrt_llm` model are ready (vLLM's /health)
  GET  /version                          LPX's version (vLLM's shape)
  POST /tokenize, /detokenize            the served tokenizer (vLLM's shapes; routes.py)
  GET  /metrics                          Prometheus text (metrics.py)

A client that disconnects (a stream or a whole answer) cancels its gRPC call, so the engine stops.
"""

from __future__ import annotations

import gc
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from . import errors
from .api_keys import KeyRing
from .choices import Choices
from .errors import ApiError, TooLarge
from .flow import collect_all, start_choices
from .flow import finish as _finish
from .flow import until_disconnect as _until_disconnect
from .generation import Piece
from .metrics import AccessLog, Metrics
from .middleware import Gate
from .plan import end_ids
from .ratelimit import RateLimits
from .responses import DONE, Renderer
from .schemas import ChatCompletionRequest, CompletionRequest
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
        """The served model's interface and limits (its repository's parameters: the limits' one road)."""
        s = self.settings
        try:
            return await self.triton.info()
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
    from .responses_api import ResponsesRequest, respond
    from .routes import add_routes

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
    add_routes(app, gw)
    # A POST to one of the generation routes skips FastAPI's stack (its router and its middleware
    # layers, each a coroutine and often a wrapped send per request) and goes straight to a plain
    # ASGI endpoint that validates the body with pydantic from the JSON bytes and answers its own errors
    # in the same shape; any other method on those paths still gets FastAPI's 405.
    fast = {
        "/v1/completions": GenerationRoute(gw, CompletionRequest, generate, chat=False),
        "/v1/chat/completions": GenerationRoute(gw, ChatCompletionRequest, generate, chat=True),
        "/v1/responses": GenerationRoute(gw, ResponsesRequest, respond, chat=True),
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


class GenerationRoute:
    """A generation route (/v1/completions, /v1/chat/completions, /v1/responses) as an ASGI endpoint."""

    def __init__(self, gw: Gateway, model: type, handler: Any, chat: bool) -> None:
        self.gw, self.model, self.handler, self.chat = gw, model, handler, chat

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        try:
            response = await self.handler(self.gw, await _body(request, self.model), request, self.chat)
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

    from .body import check_media_type, parse_body

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
    rec = request.scope["state"]["lpx"]
    gen = await start_choices(gw, body, request)
    render = Renderer(chat, rec["request_id"], gw.settings.model_name, gw.codec, body.include_usage)
    render.tools = {g.plan.index: g.tools for g in gen.gens if g.tools is not None}
    pieces = gen.pieces()
    if not body.stream:
        collected = await collect_all(gw, gen, rec, pieces, request)
        if collected is None:
            return Response(status_code=499)
        return JSONResponse(render.whole(collected, gen.usage(), gen.plan.logprobs))
    try:
        first = await pieces.__anext__()  # the engine's refusal is still a proper 4xx status here
    except StopAsyncIteration:
        first = None
    except BaseException:
        await _finish(gw, gen, rec, pieces)
        raise
    return SSEResponse(gw, gen, render, first, pieces, rec)


class SSEResponse(Response):
    """A streamed answer (the module docstring of responses.py): written by one coroutine straight from
    the engine's pieces; when the client goes away - also while the engine has not produced the next
    token - the coroutine is cancelled, which closes the gRPC call."""

    def __init__(
        self, gw: Gateway, gen: Choices, render: Renderer, first: Piece | None, pieces: Any, rec: dict
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
        render, offsets = self.render, {}
        head = b"".join(render.role_chunk(g.plan.index) for g in self.gen.gens) if render.chat else b""
        if self.first is not None:
            head += self._chunk(self.first, offsets)

        async def pump() -> None:
            try:
                await self._write(raw, offsets)
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

    def _chunk(self, piece: Piece, offsets: dict[int, int]) -> bytes:
        if piece.finish is not None:
            return self.render.finish_chunk(piece.finish, piece.index)
        offset = offsets.get(piece.index, 0)
        offsets[piece.index] = offset + len(piece.text)
        return self.render.chunk(piece, offset)

    async def _write(self, send: Any, offsets: dict[int, int]) -> None:
        render, body = self.render, "http.response.body"
        try:
            async for piece in self.pieces:
                await send({"type": body, "body": self._chunk(piece, offsets), "more_body": True})
        except ApiError as exc:
            self.rec["error"] = exc.message
            await send({"type": body, "body": render.error_event(exc.body()) + DONE, "more_body": False})
            self.rec["complete"] = True  # (no await between: a drain cannot end it a second time)
            return
        tail = render.usage_chunk(self.gen.usage()) if render.include_usage else b""
        await send({"type": body, "body": tail + DONE, "more_body": False})
        self.rec["complete"] = True
