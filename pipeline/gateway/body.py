"""The body of a request before its model: media type, UTF-8, strict JSON (no NaN, no duplicate keys,
bounded depth, no lone surrogates), then the pydantic model (`parse_body`), each refusal a 400 / 415 in
OpenAI's shape."""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ApiError, bad_request, from_validation


def _kind(value: Any) -> str:
    """A JSON value's kind, for messages ("a string", "a boolean", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


# -- the body before the models: media type, UTF-8, strict JSON ------------------------------------
MAX_DEPTH = 32  # nesting of arrays and objects; OpenAI's bodies need 5 (a tool's JSON schema a few more)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # a \uD800-\uDFFF escape: a pair, or a lone surrogate


def check_media_type(values: list[str]) -> None:
    """415 unless the one Content-Type is application/json (charset utf-8 allowed), so that a web page
    cannot drive a local gateway with a 'simple' request (text/plain, a form) that skips CORS' preflight."""
    got = values[0] if len(values) == 1 else (", ".join(values) or None)
    media, _, params = (got or "").partition(";")
    ok = len(values) == 1 and media.strip().lower() == "application/json"
    for param in filter(None, (p.strip() for p in params.split(";"))):
        name, _, value = param.partition("=")
        ok = (
            ok and name.strip().lower() == "charset" and value.strip().strip('"').lower() in ("utf-8", "utf8")
        )
    if not ok:
        raise ApiError(
            415,
            f"Content-Type {got!r} is not accepted - send the body as JSON with "
            "'Content-Type: application/json'",
            code="unsupported_media_type",
            param="Content-Type",
        )


class _NotJson(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _NotJson(f"the key {dup!r} appears twice in one object")
    return obj


def _constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value (numbers are finite)")


def _walk(obj: Any, surrogates: bool) -> None:
    """Refuse nesting deeper than MAX_DEPTH and (when `surrogates`) strings that are not UTF-8."""
    level: list[Any] = [obj]
    for _ in range(MAX_DEPTH + 1):
        below: list[Any] = []
        for item in level:
            values = item.values() if isinstance(item, dict) else item
            if surrogates and isinstance(item, dict):
                values = [*item, *values]
            for v in values:
                if isinstance(v, list | dict):
                    below.append(v)
                elif surrogates and isinstance(v, str):
                    try:
                        v.encode("utf-8")
                    except UnicodeEncodeError:
                        raise _NotJson("a string holds a lone surrogate (\\ud800-\\udfff)") from None
        if not below:
            return
        level = below
    raise _NotJson(f"it is nested deeper than {MAX_DEPTH} levels")


def read_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object: UTF-8, strict JSON (no NaN / Infinity, no duplicate keys, at most
    MAX_DEPTH levels, no lone surrogates); anything else is a 400 `invalid_json`."""
    if not raw.strip():
        raise bad_request("The request body is empty - send a JSON object", code="invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"The request body is not valid UTF-8 (at byte {exc.start}) - send JSON encoded as UTF-8",
            code="invalid_json",
        ) from None
    try:
        obj = json.loads(text, object_pairs_hook=_object, parse_constant=_constant)
        surrogates = _SURROGATE.search(text) is not None
        if surrogates or text.count("[") + text.count("{") > MAX_DEPTH:
            _walk(obj, surrogates)
    except RecursionError:
        raise bad_request(
            f"The request body is not valid JSON (it is nested deeper than {MAX_DEPTH} levels)",
            code="invalid_json",
        ) from None
    except ValueError as exc:  # JSONDecodeError, _NotJson, an integer of more than 4300 digits
        raise bad_request(
            f"The request body is not valid JSON ({exc}) - send a JSON object", code="invalid_json"
        ) from None
    if not isinstance(obj, dict):
        raise bad_request(f"The request body must be a JSON object, not {_kind(obj)}", code="invalid_json")
    return obj


def parse_body(raw: bytes, model: type) -> Any:
    """The request model from the body's bytes (400 in OpenAI's shape naming the field)."""
    from pydantic import ValidationError

    obj = read_json(raw)
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise from_validation(exc) from None
