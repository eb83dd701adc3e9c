"""POST /v1/responses: OpenAI's Responses API for text, stateless (store is not kept).

The request becomes a chat completion (instructions as the system message, `input` as a string or as
messages with input_text / output_text parts) and runs on the same path (plan.plans, choices.py);
the answer is a `response` object with one assistant message of one output_text part. A stream sends
the Responses events OpenAI's SDK reads (`response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
`response.completed`), each `event: <type>` + `data: <json>` with a sequence_number; no [DONE].
What needs server-side state (previous_response_id, background) is refused naming the fix.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse, Response
from pydantic import Field, StringConstraints

from .errors import ApiError, bad_request, from_validation
from .flow import collect_all, finish, start_choices, until_disconnect
from .schemas import INT32, MAX_MESSAGES, Body, ChatCompletionRequest, Short, check_content

SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class InputMessage(Body):
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: Any
    id: Short | None = None
    status: Short | None = None


class ResponsesRequest(Body):
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    input: str | Annotated[list[InputMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool = False
    store: bool | None = None
    metadata: dict[Short, Annotated[str, StringConstraints(max_length=512)]] | None = None
    user: Short | None = None
    service_tier: Short | None = None
    truncation: Literal["disabled", "auto"] | None = None
    text: dict[str, Any] | None = None
    previous_response_id: Short | None = None
    background: bool | None = None
    tools: Annotated[list[Any], Field(max_length=128)] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    def refuse(self) -> None:
        if self.previous_response_id:
            raise bad_request(
                "previous_response_id needs stored responses, which this server does not keep - send the "
                "whole conversation as input",
                "previous_response_id",
            )
        if self.background:
            raise bad_request("background responses are not served - leave background out", "background")
        fmt = (self.text or {}).get("format") or {"type": "text"}
        if fmt.get("type") != "text":
            raise bad_request(
                f"text.format {fmt.get('type')!r} is not served on /v1/responses - use "
                "/v1/chat/completions with response_format",
                "text.format",
            )
        if self.tools:
            raise bad_request(
                "tools are not served on /v1/responses - use /v1/chat/completions with tools", "tools"
            )

    def chat(self) -> ChatCompletionRequest:
        """The same request as a chat completion."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            for i, m in enumerate(self.input):
                messages.append({"role": m.role, "content": _text(m.content, f"input[{i}].content")})
        body = {"model": self.model, "messages": messages, "stream": self.stream}
        for ours, theirs in (("max_output_tokens", "max_tokens"), ("temperature",) * 2, ("top_p",) * 2):
            if getattr(self, ours) is not None:
                body[theirs] = getattr(self, ours)
        from pydantic import ValidationError

        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise from_validation(exc) from None


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or input_text / output_text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text"):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                    continue
            raise bad_request(f"{where}[{i}] must be an input_text part with a string text", where)
        return "".join(parts)
    check_content(content)  # the same message as chat's
    raise bad_request(f"{where} must be a string or a list of input_text parts", where)


class Shapes:
    """The response object and its parts for one request."""

    def __init__(self, body: ResponsesRequest, request_id: str) -> None:
        self.body, self.id = body, "resp_" + request_id.removeprefix("req-")
        self.msg_id, self.created = "msg_" + request_id.removeprefix("req-"), int(time.time())

    def message(self, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [self.part(text)]
        status = "in_progress" if text is None else "completed"
        return {
            "id": self.msg_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def response(self, status: str, text: str | None = None, gen: Any = None) -> dict[str, Any]:
        b = self.body
        usage = None
        if gen is not None:
            u = gen.usage()
            usage = {
                "input_tokens": u["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": u["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u["total_tokens"],
            }
        incomplete = None
        if gen is not None and gen.finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": b.model,
            "output": [] if text is None else [self.message(text)],
            "usage": usage,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "metadata": b.metadata or {},
            "parallel_tool_calls": True,
            "temperature": b.temperature,
            "top_p": b.top_p,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "truncation": b.truncation or "disabled",
            "store": False,
        }


async def respond(gw: Any, body: ResponsesRequest, request: Any, chat: bool) -> Any:
    body.refuse()
    rec = request.scope["state"]["lpx"]
    gen = await start_choices(gw, body.chat(), request)
    shapes = Shapes(body, rec["request_id"])
    pieces = gen.pieces()
    if not body.stream:
        collected = await collect_all(gw, gen, rec, pieces, request)
        if collected is None:
            return Response(status_code=499)
        text = "".join(p.text for p in collected)
        return JSONResponse(shapes.response("completed", text, gen))
    return ResponsesStream(gw, gen, shapes, pieces, rec)


class ResponsesStream(Response):
    """The Responses API's events, written as the engine's pieces come."""

    def __init__(self, gw: Any, gen: Any, shapes: Shapes, pieces: Any, rec: dict) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.gw, self.gen, self.shapes, self.pieces, self.rec = gw, gen, shapes, pieces, rec
        self.seq = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        ended = False
        try:
            ended = await until_disconnect(self._write(send), receive)
        except OSError:
            ended = False
        finally:
            if not ended:
                self.rec["disconnected"] = True
            await finish(self.gw, self.gen, self.rec, self.pieces)

    async def _write(self, send: Any) -> None:
        s, where = self.shapes, {"item_id": self.shapes.msg_id, "output_index": 0, "content_index": 0}
        head = self.event("response.created", response=s.response("in_progress"))
        head += self.event("response.in_progress", response=s.response("in_progress"))
        head += self.event("response.output_item.added", output_index=0, item=s.message(None))
        head += self.event("response.content_part.added", **where, part=s.part(""))
        await send({"type": "http.response.body", "body": head, "more_body": True})
        text = []
        try:
            async for piece in self.pieces:
                if piece.text:
                    text.append(piece.text)
                    chunk = self.event("response.output_text.delta", **where, delta=piece.text, logprobs=[])
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except ApiError as exc:
            self.rec["error"] = exc.message
            tail = self.event("error", code=exc.code, message=exc.message, param=exc.param)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return
        whole = "".join(text)
        tail = self.event("response.output_text.done", **where, text=whole, logprobs=[])
        tail += self.event("response.content_part.done", **where, part=s.part(whole))
        tail += self.event("response.output_item.done", output_index=0, item=s.message(whole))
        tail += self.event("response.completed", response=s.response("completed", whole, self.gen))
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        self.rec["complete"] = True
