"""The gateway's door, as a plain ASGI middleware (no per-request task, so streaming stays cheap): a
request id, the body limit (413), the API key (401), and at the end of every request its access-log
line and its metrics - for a stream, once its last byte is sent.

Handlers put what they learn (key, model, token counts, finish_reason, first-token time) into
`scope["state"]["lpx"]`, the request's record; the transport (transport.py) marks in it a client that
left (499) or a body that stopped coming (408).

Drain: when the server's drain time is over (process.DrainingServer sets `drained` and cancels what still
runs), each request ends here in the client's terms - a 503 in OpenAI's shape where the response has not
started, an SSE error event and `data: [DONE]` for a stream - and gets its access-log line (the log is
closed only after every request ended). No request ends as uvicorn's plain-text 500.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from .api_keys import ANONYMOUS, KeyRing
from .errors import ApiError, TooLarge, unexpected
from .metrics import AccessLog, Metrics
from .responses import DONE, Renderer

ROUTES = (
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/health/live",
    "/health/ready",
    "/health",
    "/version",
    "/tokenize",
    "/detokenize",
    "/metrics",
)
GENERATION = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
QUIET = ("/health/live", "/health/ready", "/health", "/metrics")  # logged only when they fail


def route_label(path: str) -> str:
    if path in ROUTES:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class Gate:
    def __init__(
        self,
        app: Any,
        keys: KeyRing,
        metrics: Metrics,
        log: AccessLog,
        open_routes: list[str],
        max_body: int,
        drain_timeout_s: float = 0.0,
    ):
        self.app, self.keys, self.metrics, self.log = app, keys, metrics, log
        self.open_routes, self.max_body = set(open_routes), max_body
        if "/health/ready" in self.open_routes:  # vLLM's /health is the same readiness check
            self.open_routes.add("/health")
        self.drain_timeout_s = drain_timeout_s
        self.drained = False  # the drain time is over: a cancelled request is ended by _drain_end

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope["path"]
        rid = _header(scope, b"x-request-id") or f"req-{secrets.token_hex(8)}"
        rid = rid[:128]
        rec: dict[str, Any] = {
            "time": time.time(),
            "t0": t0,
            "request_id": rid,
            "key_id": None,
            "route": route_label(path),
            "status": None,
            "stream": None,
        }
        rec["raw_send"] = send  # streamed body chunks skip the wrappers (app.SSEResponse)
        scope.setdefault("state", {})["lpx"] = rec
        raw_id = rid.encode("latin-1", "replace")

        async def send_wrapped(message: dict) -> None:
            if message["type"] == "http.response.start":
                rec["status"] = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", raw_id)]
            await send(message)

        try:
            refusal = self._check(scope, path, rec)
            if refusal is not None:
                await self._answer(refusal, rec, send_wrapped)
                return
            await self.app(scope, self._limited(receive, rec), send_wrapped)
        except TooLarge:
            if rec["status"] is None:
                await self._answer(self._too_large(), rec, send_wrapped)
        except asyncio.CancelledError:
            if not self.drained:
                raise
            await self._drain_end(rec, send_wrapped)
        except Exception as exc:  # a bug: still OpenAI's shape, never uvicorn's plain-text 500
            if rec["status"] is not None:
                rec["error"] = f"{type(exc).__name__}: {exc}"
                raise
            await self._answer(unexpected(exc, path), rec, send_wrapped)
        finally:
            self._record(rec)

    async def _drain_end(self, rec: dict, send: Any) -> None:
        """End a request the drain cancelled the way its client can read."""
        error = ApiError(
            503,
            f"The server is shutting down and ended this request when its drain time of "
            f"{self.drain_timeout_s:g} s (serving.openai.drain_timeout_s) ran out - send it again",
            code="server_shutting_down",
        )
        if rec["status"] is None:
            await self._answer(error, rec, send)
        elif rec.get("stream") and rec["status"] == 200 and not rec.get("complete"):
            rec["error"] = error.message
            tail = Renderer.error_event(error.body()) + DONE
            await rec["raw_send"]({"type": "http.response.body", "body": tail, "more_body": False})
            rec["complete"] = True

    def _check(self, scope: dict, path: str, rec: dict) -> ApiError | None:
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return self._too_large()
        if path in self.open_routes:
            return None
        if not self.keys.required:
            rec["key_id"] = ANONYMOUS
            return None
        if self.keys.broken is not None:  # logged once by the ring, naming the file
            return ApiError(
                401,
                "API keys cannot be checked now: the server's keys file is missing or unreadable - the "
                "server's operator must restore it (the gateway's log names it); every key is refused until then",
                code="keys_unavailable",
                type="invalid_request_error",
            )
        auth = _header(scope, b"authorization") or ""
        scheme, _, secret = auth.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return ApiError(
                401,
                "No API key given - send 'Authorization: Bearer <key>' (create one with 'lpx keys add')",
                code="invalid_api_key",
                type="invalid_request_error",
            )
        key = self.keys.find(secret.strip())
        if key is None:
            return ApiError(
                401,
                "Incorrect API key provided - check the key, or create one with 'lpx keys add'",
                code="invalid_api_key",
                type="invalid_request_error",
            )
        rec["key_id"], rec["key"] = key.id, key
        return None

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"The request body is above this server's limit of {self.max_body} bytes "
            "(serving.openai.max_body_bytes) - send a smaller request",
            code="request_too_large",
        )

    def _limited(self, receive: Any, rec: dict) -> Any:
        """receive(), refusing a body (chunked, or longer than its Content-Length) past the limit."""
        seen = [0]

        async def wrapped() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body:
                    raise TooLarge(self._too_large())
            return message

        return wrapped

    @staticmethod
    async def _answer(error: ApiError, rec: dict, send: Any) -> None:
        rec["error"] = error.message
        await error.response()({"type": "http"}, _no_receive, send)

    def _record(self, rec: dict) -> None:
        end = time.perf_counter()
        rec["latency_ms"] = round((end - rec["t0"]) * 1e3, 3)
        if rec.get("timed_out"):  # the transport answered 408 (transport.py)
            rec["status"], rec["error"] = 408, rec["timed_out"]
        elif rec.get("disconnected"):
            rec["status"], rec["error"] = 499, "client disconnected"
        status = rec["status"] or 500
        rec["status"] = status
        self.metrics.requests.labels(rec["route"], str(status)).inc()
        if rec["route"] in GENERATION and rec.get("generated"):
            first, last, n = (
                rec.get("first_token_at"),
                rec.get("last_token_at"),
                rec.get("completion_tokens") or 0,
            )
            rec["ttft_ms"] = round((first - rec["t0"]) * 1e3, 3) if first else None
            rec["itl_ms"] = (last - first) * 1e3 / (n - 1) if first and last and n > 1 else None
            self.metrics.observe(rec)
        if rec["route"] not in QUIET or status >= 400:
            self.log.write(rec)


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}
