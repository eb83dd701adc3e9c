"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol with the limits it lacks, enforced
before a request reaches the application (so before the API key is looked at).

- The request line and headers together may take at most `max_header_bytes` (counted on the raw bytes,
  before httptools buffers a header): past it the client gets 431 and the connection is closed, so a
  64 MiB header costs the gateway at most one read buffer, not 64 MiB.
- The headers must be complete within `header_timeout_s` of the connection's opening (or of the first
  byte of a following request on a kept-alive connection): else 408 (nothing, when not one byte came)
  and the connection is closed.
- While a body is read, `body_timeout_s` may pass at most between two reads: else 408 (where the response
  has not started) and the connection is closed; the request's access-log line says 408.
- A client that leaves before its response ended is marked in its access-log record (499), whatever the
  application was doing (reading the body, waiting for the engine).

Refusals here are OpenAI-shaped JSON and counted in `lpx_gateway_connections_refused_total{reason}`; they
have no access-log line when no request was read yet (431, header timeout): there is no request to log.
"""

from __future__ import annotations

import http
import json
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def raw_answer(status: int, message: str, code: str, request_id: str | None = None) -> bytes:
    """A whole HTTP/1.1 response with OpenAI's error body, closing the connection."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    head = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if request_id:
        head.append(f"x-request-id: {request_id}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class StrictHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above (class attributes, set by strict_protocol)."""

    max_header_bytes = 16_384
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    metrics: Any = None  # metrics.Metrics: its `refused` counter

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head, self._head_seen, self._heads = True, 0, 0
        self._head_timer: Any = self.loop.call_later(self.header_timeout_s, self._head_expired)
        self._body_timer: Any = None
        self._body_at = 0.0

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            rec = _record_of(cycle)
            if rec is not None and not rec.get("timed_out"):
                rec["disconnected"] = True
        super().connection_lost(exc)

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    # -- the head: size and time ----------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            super().data_received(data)
            return
        if self._head_timer is None:  # the first byte of a following request on this connection
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_expired)
        room = self.max_header_bytes - self._head_seen
        if len(data) <= room:
            self._head_seen += len(data)
            super().data_received(data)
            return
        heads = self._heads
        super().data_received(data[:room])  # the head may end inside what still fits
        if self.transport.is_closing():
            return
        if self._heads == heads:
            self._refuse(
                431,
                f"The request's headers are above this server's limit of {self.max_header_bytes} bytes "
                "(serving.openai.max_header_bytes) - send fewer or shorter headers",
                "headers_too_large",
            )
            return
        super().data_received(data[room:])

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._body_at = time.monotonic()
        self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_expired)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_at = time.monotonic()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._in_head, self._head_seen = True, 0
        super().on_message_complete()

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined request's head came while the last one is still answered: its clock
            # starts when that answer ends
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_expired)
            return
        if self._head_seen == 0:  # not one byte of a request: just close
            self.metrics.refused.labels("idle").inc()
            self.transport.close()
            return
        self._refuse(
            408,
            f"The request's headers did not arrive within {self.header_timeout_s:g} s "
            "(serving.openai.header_timeout_s) - send the whole request at once",
            "header_timeout",
        )

    # -- the body: time between reads ----------------------------------------------------------
    def _body_expired(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        left = self._body_at + self.body_timeout_s - time.monotonic()
        if left > 0 or self.flow.read_paused:  # data came since, or the application is not reading
            self._body_timer = self.loop.call_later(max(left, 0.05), self._body_expired)
            return
        cycle = self.cycle
        message = (
            f"No part of the request body arrived for {self.body_timeout_s:g} s "
            "(serving.openai.body_timeout_s) - send the body without pauses"
        )
        rec = _record_of(cycle) if cycle is not None else None
        if rec is not None:
            rec["timed_out"] = message  # the Gate logs 408 with it, whatever the app did since
        if cycle is not None and not cycle.response_started:
            self._refuse(408, message, "body_timeout", rec and rec.get("request_id"))
        else:
            self.metrics.refused.labels("body_timeout").inc()
            self.transport.close()
        if cycle is not None:  # the application's receive() answers http.disconnect now
            cycle.disconnected = True
            cycle.message_event.set()

    def _refuse(self, status: int, message: str, code: str, request_id: str | None = None) -> None:
        self.metrics.refused.labels(code).inc()
        self._cancel_timers()
        self.transport.write(raw_answer(status, message, code, request_id))
        self.transport.close()


def strict_protocol(
    max_header_bytes: int, header_timeout_s: float, body_timeout_s: float, metrics: Any
) -> type:
    """The protocol class for uvicorn.Config(http=...), with these limits."""
    limits = {
        "max_header_bytes": max_header_bytes,
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s,
        "metrics": metrics,
    }
    return type("StrictHttpProtocol", (StrictHttpProtocol,), limits)


def _record_of(cycle: Any) -> dict | None:
    state = cycle.scope.get("state")
    return state.get("lpx") if isinstance(state, dict) else None
