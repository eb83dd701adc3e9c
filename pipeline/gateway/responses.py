"""OpenAI's response objects: whole answers, and the server-sent events of a stream.

A stream is `data: <chunk>` events: for chat the first delta of each choice carries the role, then
content deltas, then one chunk per choice with its finish_reason (its delta empty) - choices interleaved
as they are produced, each chunk naming its index - then, with stream_options.include_usage, a chunk
with no choices and the usage, then `data: [DONE]`. Every chunk is written from a prefix rendered once
per request, so a token costs one json.dumps of its text.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .generation import Piece
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
        self._head = head[:-1] + ',"choices":[{"index":'
        self._tail = "}]" + (',"usage":null' if include_usage else "") + "}"
        # choice index -> tools.ToolCalls where the answer may be tool calls (set per request, one per
        # choice: each parses its own text)
        self.tools: dict[int, Any] = {}

    # -- log probabilities --------------------------------------------------------------------
    def _entry(self, token: int, lp: float) -> dict[str, Any]:
        text = self.codec.token_text(token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    def _chat_logprobs(self, piece: Piece) -> list[dict[str, Any]]:
        out = []
        for i, (token, lp) in enumerate(zip(piece.tokens, piece.logprobs or [], strict=False)):
            alts = piece.top[i] if piece.top and i < len(piece.top) else []
            out.append(self._entry(token, lp) | {"top_logprobs": [self._entry(t, v) for t, v in alts]})
        return out

    def _completion_logprobs(self, piece: Piece, offset: int) -> dict[str, Any]:
        texts = [self.codec.token_text(t) for t in piece.tokens]
        offsets, at = [], offset
        for text in texts:
            offsets.append(at)
            at += len(text)
        top = None
        if piece.top is not None:
            top = [{self.codec.token_text(t): v for t, v in alts} for alts in piece.top]
        return {
            "tokens": texts,
            "token_logprobs": list(piece.logprobs or []),
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def logprobs(self, piece: Piece, offset: int = 0) -> Any:
        if piece.logprobs is None:
            return None
        if self.chat:
            return {"content": self._chat_logprobs(piece)}
        return self._completion_logprobs(piece, offset)

    # -- streaming ----------------------------------------------------------------------------
    def role_chunk(self, index: int = 0) -> bytes:
        return _event(
            self._head
            + str(index)
            + ',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null'
            + self._tail
        )

    def chunk(self, piece: Piece, offset: int) -> bytes:
        calls = self.tools.get(piece.index) if self.chat else None
        if calls is not None:
            return self._tool_chunk(calls, piece, offset)
        lp = self.logprobs(piece, offset)
        lp_text = "null" if lp is None else json.dumps(lp)
        if self.chat:
            body = '"delta":{"content":' + json.dumps(piece.text) + '},"logprobs":' + lp_text
        else:
            body = '"text":' + json.dumps(piece.text) + ',"logprobs":' + lp_text
        return _event(self._head + str(piece.index) + "," + body + ',"finish_reason":null' + self._tail)

    def _delta_chunk(self, index: int, delta: dict[str, Any], lp: Any = None) -> bytes:
        body = '"delta":' + json.dumps(delta, ensure_ascii=False) + ',"logprobs":' + json.dumps(lp)
        return _event(self._head + str(index) + "," + body + ',"finish_reason":null' + self._tail)

    def _tool_chunk(self, calls: Any, piece: Piece, offset: int) -> bytes:
        """A tool request's piece: a named call's argument delta, or nothing yet (tools.ToolCalls)."""
        delta = calls.delta(piece.text)
        return b"" if delta is None else self._delta_chunk(piece.index, delta, self.logprobs(piece, offset))

    def finish_chunk(self, reason: str, index: int = 0) -> bytes:
        head = b""
        calls = self.tools.get(index) if self.chat else None
        if calls is not None:
            deltas, reason = calls.end(reason)
            head = b"".join(self._delta_chunk(index, d) for d in deltas)
        body = '"delta":{}' if self.chat else '"text":""'
        return head + _event(
            self._head
            + str(index)
            + ","
            + body
            + ',"logprobs":null,"finish_reason":'
            + json.dumps(reason)
            + self._tail
        )

    def usage_chunk(self, usage: dict[str, int]) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return _event(
            json.dumps(
                {
                    "id": self.id,
                    "object": kind,
                    "created": self.created,
                    "model": self.model,
                    "choices": [],
                    "usage": usage,
                },
                separators=(",", ":"),
            )
        )

    @staticmethod
    def error_event(body: dict[str, Any]) -> bytes:
        return _event(json.dumps(body))

    # -- whole answers ------------------------------------------------------------------------
    def choice(self, index: int, pieces: list[Piece], finish: str | None, logprobs: bool) -> dict[str, Any]:
        """One whole choice from its pieces (the finish marker left out)."""
        text = "".join(p.text for p in pieces)
        lp: Any = None
        if logprobs:
            tokens = [t for p in pieces for t in p.tokens]
            values = [v for p in pieces for v in (p.logprobs or [])]
            top = [a for p in pieces for a in (p.top or [])] if any(p.top for p in pieces) else None
            lp = self.logprobs(Piece(text, tokens, values, top=top), 0)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            calls = self.tools.get(index)
            if calls is not None:
                message, finish = calls.message(text, finish)
            return {"index": index, "message": message, "logprobs": lp, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}

    def whole(self, pieces: list[Piece], usage: dict[str, int], logprobs: bool) -> dict[str, Any]:
        """The answer from every piece of every choice (choices.py's markers carry each finish_reason)."""
        by_index: dict[int, list[Piece]] = {}
        finish: dict[int, str | None] = {}
        for piece in pieces:
            if piece.finish is not None:
                finish[piece.index] = piece.finish
            else:
                by_index.setdefault(piece.index, []).append(piece)
        indices = sorted(set(by_index) | set(finish))
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self.choice(i, by_index.get(i, []), finish.get(i), logprobs) for i in indices],
            "usage": usage,
        }
