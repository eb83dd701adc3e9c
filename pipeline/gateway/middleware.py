"""The gateway's door, as a plain ASGI middleware (no per-request task, so streaming stays cheap): a
request id, the body limit (413), the API key (401), and at the end of every request its access-log
line and its metrics - for a stream, once its last byte is sent.

Handlers put what they learn (key, model, token counts, finish_reason, first-token time) into
`scope["state"]["lpx"]`, the request's record.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from .errors import ApiError, TooLarge
from .keys import ANONYMOUS, KeyRing
from .metrics import AccessLog, Metrics

ROUTES = (
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/health/live",
    "/health/ready",
    "/metrics",
)
GENERATION = ("/v1/completions", "/v1/chat/completions")
QUIET = ("/health/live", "/health/ready", "/metrics")  # logged only when they fail


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
        self, app: Any, keys: KeyRing, metrics: Metrics, log: AccessLog, open_routes: list[str], max_body: int
    ):
        self.app, self.keys, self.metrics, self.log = app, keys, metrics, log
        self.open_routes, self.max_body = set(open_routes), max_body

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
        finally:
            self._record(rec)

    def _check(self, scope: dict, path: str, rec: dict) -> ApiError | None:
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return self._too_large()
        if path in self.open_routes:
            return None
        if not self.keys.required:
            rec["key_id"] = ANONYMOUS
            return None
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
        if rec.get("disconnected"):
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
