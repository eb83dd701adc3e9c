"""Every answer that is not a success, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

`ApiError` is raised anywhere in the gateway; `install` registers handlers so that FastAPI's request
validation errors, Starlette's HTTP errors (404 route, 405 method) and any unexpected exception also come
out in that shape - never a bare 500 page or a traceback.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

log = logging.getLogger("lpx.gateway")

TYPES = {  # status -> OpenAI's error type
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    500: "server_error",
    503: "server_error",
    504: "server_error",
}


class TooLarge(Exception):
    """A request body went past the limit while it was read (raised by the middleware's receive)."""


class ApiError(Exception):
    """An error answered as `status` with OpenAI's error body; `headers` ride along (Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(
            json.dumps(self.body()),
            status_code=self.status,
            media_type="application/json",
            headers=self.headers,
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


def _field(loc: tuple) -> str | None:
    """Pydantic's location as OpenAI writes a parameter: `messages[0].content`, without the names pydantic
    gives the members of a union (`str`, `list[int]`, `function-plain[...]`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "body" and not _TAG.search(part):
            out += f".{part}" if out else part
    return out or None


_TAG = re.compile(r"^(str|int|float|bool|none|list|dict)$|[\[\]-]")


def _got(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object", type(None): "null"}.get(type(value), "")


def from_validation(exc: Any) -> ApiError:
    """Pydantic's (or FastAPI's) first complaint about the body as a 400 naming the field (OpenAI answers
    400, not 422)."""
    errors = exc.errors()
    if not errors:
        return bad_request("The request body is not valid - send a JSON object")
    first = errors[0]
    where = _field(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return bad_request(
            f"The request body is not valid JSON ({first.get('msg', '')}) - send a JSON object",
            code="invalid_json",
        )
    if where is None and kind in ("model_type", "dict_type", "model_attributes_type"):
        return bad_request("The request body must be a JSON object", code="invalid_json")
    msg = str(first.get("msg", "is not valid"))
    if kind == "missing":
        message = f"'{where}' is required"
    elif kind == "extra_forbidden":
        message = f"'{where}' is not a parameter this server knows - leave it out"
    elif kind == "invalid_value":  # the gateway's own checks (schemas.py): a phrase after the field's name
        message = f"'{where}' {msg}"
    else:
        msg = msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg
        got = _got(first.get("input")) if kind.endswith("_type") or kind.endswith("_parsing") else ""
        msg += f", not {got}" if got else ""
        message = f"'{where}': {msg}" if where else msg
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return bad_request(message + more, param=where)


def _noted(request: Request, exc: ApiError) -> Response:
    """The response, with the message noted in the request's access-log record."""
    rec = request.scope.get("state", {}).get("lpx")
    if rec is not None:
        rec["error"] = exc.message
    return exc.response()


def install(app: FastAPI) -> None:
    """Answer every error in OpenAI's shape."""

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> Response:
        return _noted(request, exc)

    @app.exception_handler(TooLarge)
    async def _too_large(request: Request, exc: TooLarge) -> Response:
        return _noted(request, exc.args[0])

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return _noted(request, from_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc.__cause__, TooLarge):  # FastAPI wraps an error of reading the body in a 400
            return _noted(request, exc.__cause__.args[0])
        if exc.status_code == 404:
            message = f"No route {request.url.path} - the routes are /v1/models, /v1/completions, /v1/chat/completions, /health/live, /health/ready and /metrics"
            code = "not_found"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
            code = "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return _noted(request, ApiError(exc.status_code, message, code=code, headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        return _noted(request, unexpected(exc, request.url.path))


def unexpected(exc: BaseException, path: str) -> ApiError:
    """A 500 for an error that is the gateway's own fault (logged with its traceback)."""
    log.error("unexpected error on %s", path, exc_info=exc)
    return ApiError(
        500,
        f"The gateway failed unexpectedly ({type(exc).__name__}: {exc}) - see its log; "
        "this is a bug, please report it",
        code="internal_error",
    )
