"""The gateway's routes besides generation, through FastAPI: health, version, models, metrics, and the
served tokenizer in vLLM's shapes.

  GET  /health/live      {"status": "live"}: the gateway runs
  GET  /health/ready     {"status": "ready", "model": ...}, or 503 naming what is not ready
  GET  /health           vLLM's: 200 with an empty body when ready, else the 503 above
  GET  /version          {"version": "<LPX's>"}
  POST /tokenize         {"prompt": str, "add_special_tokens": true} or {"messages": [...],
                         "add_generation_prompt": true} -> {"count", "max_model_len", "tokens", "token_strs"}
  POST /detokenize       {"tokens": [ids]} -> {"prompt": text}
  GET  /v1/models[/id]   the one served model
  GET  /metrics          Prometheus text
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, StringConstraints, field_validator

from .. import __version__
from .errors import ApiError, bad_request
from .schemas import MAX_MESSAGES, MAX_PROMPT_IDS, Body, ChatMessage, _ids, model_mismatch

Model = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class TokenizeRequest(Body):
    """vLLM's /tokenize: a completion prompt, or chat messages through the chat template."""

    model: Model | None = None
    prompt: Annotated[str, StringConstraints(max_length=MAX_PROMPT_IDS * 8)] | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(Body):
    model: Model | None = None
    tokens: list[Any]

    _tokens = field_validator("tokens", mode="plain")(lambda v: _ids(v, "") if isinstance(v, list) else v)


def add_routes(app: FastAPI, gw: Any) -> None:
    _health_routes(app, gw)
    _model_routes(app, gw)
    _tokenizer_routes(app, gw)


def _health_routes(app: FastAPI, gw: Any) -> None:
    async def check_ready() -> None:
        ok, why = await gw.triton.ready()
        if not ok:
            raise ApiError(503, why + " - wait for it to load, or see Triton's log", code="not_ready")
        await gw.model_info()

    @app.get("/health/live")
    async def live() -> dict:
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> Response:
        await check_ready()
        return JSONResponse({"status": "ready", "model": gw.settings.model_name})

    @app.get("/health")
    async def health() -> Response:
        await check_ready()
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        body, kind = gw.metrics.render()
        return Response(body, media_type=kind)


def _model_routes(app: FastAPI, gw: Any) -> None:
    def model_card() -> dict:
        return {"id": gw.settings.model_name, "object": "model", "created": gw.started, "owned_by": "lpx"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        if model_id != gw.settings.model_name:
            raise model_mismatch(model_id, gw.settings.model_name)
        return model_card()


async def _read(request: Request, model: type, name: str) -> Any:
    from .body import check_media_type, parse_body

    check_media_type(request.headers.getlist("content-type"))
    body = parse_body(await request.body(), model)
    if body.model is not None and body.model != name:
        raise model_mismatch(body.model, name)
    return body


def _tokenizer_routes(app: FastAPI, gw: Any) -> None:
    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await _read(request, TokenizeRequest, gw.settings.model_name)
        codec = gw.codec
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("send either prompt (text) or messages (chat) - exactly one of them", "prompt")
        if body.messages is not None:
            for i, message in enumerate(body.messages):
                message.refuse(i)
            messages = [m.model_dump(exclude_none=True) | {"content": m.text()} for m in body.messages]
            ids = codec.encode_chat(messages, add_generation_prompt=body.add_generation_prompt)
        elif body.add_special_tokens:
            ids = codec.encode(body.prompt)
        else:
            ids = list(codec.tokenizer(body.prompt, add_special_tokens=False)["input_ids"])
        info = await gw.model_info()
        strs = [codec.token_text(t) for t in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": info.max_seq_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await _read(request, DetokenizeRequest, gw.settings.model_name)
        top = gw.codec.vocab_size - 1
        bad = [t for t in body.tokens if t > top]
        if bad:
            raise bad_request(f"tokens {bad[:5]} are outside the vocabulary (0..{top})", "tokens")
        return {"prompt": gw.codec.decode(list(body.tokens))}
