"""One `path: message` line per validation problem, each naming the fix: the value it got, the limit and
why (base.bounded's `limit`), the key meant (did-you-mean, or the section an unknown key belongs in)."""

from __future__ import annotations

import difflib
import math
import re
import typing
from collections.abc import Iterator

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

SCHEMA_HINT = "`lpx config schema` lists every key"


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("literal[", "function-")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation holds: X, X | None, list[X]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _walk(root: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model that holds the last key of `loc`, and that key's field (None where it is unknown)."""
    model: type[BaseModel] | None = root
    field = None
    for i, part in enumerate(loc):
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(str(part))
        if i == len(loc) - 1:
            return model, field
        if field is None:
            return None, None
        model = next(_models_in(field.annotation), None)
    return model, field


def _sections(model: type[BaseModel], path: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    yield path, model
    for name, field in model.model_fields.items():
        for sub in _models_in(field.annotation):
            yield from _sections(sub, f"{path}.{name}" if path else name)


def _unknown_key(root: type[BaseModel], loc: tuple) -> str:
    key = str(loc[-1])
    model, _ = _walk(root, loc)
    if model is not None:
        close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.75)
        if close:
            return f"unknown key - did you mean '{close[0]}'? ({SCHEMA_HINT})"
    homes = [path for path, m in _sections(root) if key in m.model_fields and m is not model]
    if homes:
        where = " or ".join(f"'{h or '(top level)'}'" for h in homes[:3])
        return f"unknown key here - '{key}' belongs in {where}; move it there ({SCHEMA_HINT})"
    return f"unknown key (check the spelling; {SCHEMA_HINT})"


def _yaml(v: object) -> str:
    """A value as the user wrote it in YAML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return ".nan" if math.isnan(v) else (".inf" if v > 0 else "-.inf")
    if isinstance(v, str):
        return f"the string '{v}'" if len(v) <= 40 else f"a string of {len(v)} characters"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return "nothing (null)" if v is None else str(v)


def _kind(v: object, what: str, example: str) -> str:
    if isinstance(v, str):
        return f"must be {what}, not {_yaml(v)} - write it without quotes, e.g. {example}"
    return f"must be {what}, not {_yaml(v)} - write e.g. {example}"


def _bound(err: dict, limit: str | None) -> str:
    ctx, got = err.get("ctx", {}), err.get("input")
    why = f" ({limit})" if limit else ""
    if "le" in ctx:
        return f"is {got}, above the largest allowed value {ctx['le']}{why} - set it to at most {ctx['le']}"
    if "lt" in ctx:
        return f"is {got}; it must be below {ctx['lt']}{why} - lower it"
    if "ge" in ctx:
        return f"is {got}, below the smallest allowed value {ctx['ge']} - set it to at least {ctx['ge']}"
    return f"is {got}; it must be above {ctx.get('gt')} - raise it"


def _text(err: dict, limit: str | None) -> str:
    kind, got, ctx = err["type"], err.get("input"), err.get("ctx", {})
    if kind == "string_too_long":
        n = len(got) if isinstance(got, str) else "?"
        why = f" ({limit})" if limit else ""
        return f"is {n} characters long; at most {ctx.get('max_length')} are allowed{why} - shorten it"
    if kind == "string_pattern_mismatch":
        from .base import NAME_RE

        if ctx.get("pattern") == NAME_RE:
            return (
                f"'{got}' cannot be used as a name - use only letters, digits, '.', '_' and '-', "
                "starting with a letter or digit"
            )
        return f"'{got}' does not have the form {ctx.get('pattern')} - correct it"
    return err["msg"]


def _message(root: type[BaseModel], err: dict) -> str:
    kind, got = err["type"], err.get("input")
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return "must be one of " + ", ".join(re.findall(r"'([^']*)'", expected))
    if kind == "extra_forbidden":
        return _unknown_key(root, err["loc"])
    if kind == "missing":
        return "required"
    if kind == "int_type":
        return _kind(got, "a whole number", "8")
    if kind == "float_type":
        return _kind(got, "a number", "0.5")
    if kind == "bool_type":
        return _kind(got, "true or false", "true")
    if kind == "string_type":
        return f'must be text, not {_yaml(got)} - put it in quotes, e.g. "{got}"'
    if kind == "finite_number":
        return f"must be a finite number, not {_yaml(got)} - write a number, e.g. 600"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping (indented `key: value` lines), not {_yaml(got)}"
    if kind == "list_type":
        return f"must be a list (e.g. [a, b] or `- a` lines), not {_yaml(got)}"
    _, field = _walk(root, err["loc"])
    extra = field.json_schema_extra if field is not None else None
    limit = extra.get("limit") if isinstance(extra, dict) else None
    if kind in ("less_than_equal", "less_than", "greater_than_equal", "greater_than"):
        return _bound(err, limit if kind.startswith("less") else None)
    msg = _text(err, limit)
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg


def format_errors(exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """One `path: message` line per problem; `root`, the model validated, resolves the paths."""
    return [f"{_loc(e['loc'])}: {_message(root, e)}" for e in exc.errors()]


def section_of(exc: ValidationError, top: type[BaseModel]) -> type[BaseModel]:
    """The section model of `top` (or `top` itself) that raised `exc`."""
    found = [m for _, m in _sections(top) if m.__name__ == exc.title]
    return found[0] if found else top
