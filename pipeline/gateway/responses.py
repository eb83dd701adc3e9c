"""OpenAI's response objects: whole answers, and the server-sent events of a stream.

A stream is `data: <chunk>` events: for chat the first delta carries the role, then content deltas, then
one chunk with the finish_reason (its delta empty), then - with stream_options.include_usage - a chunk
with no choices and the usage, then `data: [DONE]`. Every chunk is written from a prefix rendered once
per request, so a token costs one json.dumps of its text.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .generation import Generation, Piece
from .text import TextCodec

DONE = b"data: [DONE]\n\n"


def _event(payload: str) -> bytes:
    return b"data: " + payload.encode("utf-8") + b"\n\n"


class Renderer:
    """The objects of one request (`chat`: chat.completion, else text_completion)."""

    def __init__(self, chat: bool, request_id: str, model: str, codec: TextCodec, include_usage: bool):
        self.chat, self.codec = chat, codec
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id.removeprefix("req-")
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = json.dumps(
            {"id": self.id, "object": kind, "created": self.created, "model": self.model},
            separators=(",", ":"),
        )
        self._head = head[:-1] + ',"choices":[{"index":0,'
        self._tail = "}]" + (',"usage":null' if include_usage else "") + "}"
        self.tools: Any = None  # tools.ToolCalls when the answer may be tool calls (set per request)

    # -- log probabilities --------------------------------------------------------------------
    def _chat_logprobs(self, tokens: list[int], values: list[float]) -> list[dict[str, Any]]:
        out = []
        for token, lp in zip(tokens, values, strict=False):
            text = self.codec.token_text(token)
            out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
        return out

    def _completion_logprobs(self, tokens: list[int], values: list[float], offset: int) -> dict[str, Any]:
        texts = [self.codec.token_text(t) for t in tokens]
        offsets, at = [], offset
        for text in texts:
            offsets.append(at)
            at += len(text)
        return {"tokens": texts, "token_logprobs": list(values), "top_logprobs": None, "text_offset": offsets}

    def logprobs(self, piece: Piece, offset: int = 0) -> Any:
        if piece.logprobs is None:
            return None
        tokens, values = piece.tokens, piece.logprobs
        if self.chat:
            return {"content": self._chat_logprobs(tokens, values)}
        return self._completion_logprobs(tokens, values, offset)

    # -- streaming ----------------------------------------------------------------------------
    def role_chunk(self) -> bytes:
        return _event(
            self._head
            + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null'
            + self._tail
        )

    def chunk(self, piece: Piece, offset: int) -> bytes:
        if self.tools is not None and self.chat:
            return self._tool_chunk(piece, offset)
        lp = self.logprobs(piece, offset)
        lp_text = "null" if lp is None else json.dumps(lp)
        if self.chat:
            body = '"delta":{"content":' + json.dumps(piece.text) + '},"logprobs":' + lp_text
        else:
            body = '"text":' + json.dumps(piece.text) + ',"logprobs":' + lp_text
        return _event(self._head + body + ',"finish_reason":null' + self._tail)

    def _delta_chunk(self, delta: dict[str, Any], lp: Any = None) -> bytes:
        body = '"delta":' + json.dumps(delta, ensure_ascii=False) + ',"logprobs":' + json.dumps(lp)
        return _event(self._head + body + ',"finish_reason":null' + self._tail)

    def _tool_chunk(self, piece: Piece, offset: int) -> bytes:
        """A tool request's piece: a named call's argument delta, or nothing yet (tools.ToolCalls)."""
        delta = self.tools.delta(piece.text)
        return b"" if delta is None else self._delta_chunk(delta, self.logprobs(piece, offset))

    def finish_chunk(self, reason: str) -> bytes:
        head = b""
        if self.tools is not None and self.chat:
            deltas, reason = self.tools.end(reason)
            head = b"".join(self._delta_chunk(d) for d in deltas)
        body = '"delta":{}' if self.chat else '"text":""'
        return head + _event(
            self._head + body + ',"logprobs":null,"finish_reason":' + json.dumps(reason) + self._tail
        )

    def usage_chunk(self, gen: Generation) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return _event(
            json.dumps(
                {
                    "id": self.id,
                    "object": kind,
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": gen.usage(),
                },
                separators=(",", ":"),
            )
        )

    @staticmethod
    def error_event(body: dict[str, Any]) -> bytes:
        return _event(json.dumps(body))

    # -- whole answers ------------------------------------------------------------------------
    def whole(self, text: str, gen: Generation, pieces: list[Piece]) -> dict[str, Any]:
        lp: Any = None
        if gen.plan.logprobs:
            tokens = [t for p in pieces for t in p.tokens]
            values = [v for p in pieces for v in (p.logprobs or [])]
            lp = self.logprobs(Piece(text, tokens, values), 0)
        if self.chat:
            message, reason = {"role": "assistant", "content": text}, gen.finish_reason
            if self.tools is not None:
                message, reason = self.tools.message(text, reason)
            choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": gen.finish_reason}
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": gen.usage(),
        }
