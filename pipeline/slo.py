"""The latency SLO grammar, in one place: lpx.yaml's `tune.slo` (pipeline/config/tune.py) and the `--slo`
options of `lpx bench`, `lpx tune` and `lpx monitoring` all parse with `parse_slo`, so a string one
accepts the others accept too. It imports nothing of LPX but the errors, so the config package can use
it without importing the bench.

    SLO   = BOUND ("," BOUND)*
    BOUND = KEY "=" NUMBER UNIT?      KEY: ttft | itl | e2e (any case); UNIT: ms | s (any case; none = ms)

Spaces around the parts are allowed; a number is decimal (no sign, no exponent) and above 0; a key
appears once. Blank text is no SLO ({}), refused where one is required.
"""

from __future__ import annotations

import re

from .errors import UsageError

SLO_KEYS = ("ttft", "itl", "e2e")
UNITS_MS = {"ms": 1.0, "s": 1000.0, "": 1.0}
EXAMPLE = "ttft=200ms,itl=30ms"
_NUMBER = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?", re.IGNORECASE)


def _bound(part: str) -> tuple[str, float]:
    """One `key=value` bound as (key, milliseconds); ValueError saying what is wrong with it."""
    key, sep, value = part.partition("=")
    key, value = key.strip().lower(), value.strip()
    if not sep or key not in SLO_KEYS:
        raise ValueError(f"{part.strip()!r} is not KEY=VALUE with a key of {', '.join(SLO_KEYS)}")
    m = _NUMBER.fullmatch(value)
    if m is None:
        raise ValueError(f"{value!r} in {part.strip()!r} is not a number with ms or s")
    ms = float(m.group(1)) * UNITS_MS[(m.group(2) or "").lower()]
    if ms <= 0:
        raise ValueError(f"{part.strip()!r} must be above 0")
    return key, ms


def slo_problem(text: str | None, required: bool = False) -> str | None:
    """What is wrong with `text` as an SLO, or None when it is one."""
    try:
        _parse(text, required)
    except ValueError as exc:
        return str(exc)
    return None


def _parse(text: str | None, required: bool) -> dict[str, float]:
    if text is None or not text.strip():
        if required:
            raise ValueError("no bound given")
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            raise ValueError("an empty bound between commas")
        key, ms = _bound(part)
        if key in slo:
            raise ValueError(f"{key} is bounded twice")
        slo[key] = ms
    return slo


def parse_slo(text: str | None, where: str = "--slo", required: bool = False) -> dict[str, float]:
    """'ttft=200ms,itl=0.05s' -> {'ttft': 200.0, 'itl': 50.0} (milliseconds). A UsageError naming `where`
    (the option or config key) and the fix for anything else; blank text is {} unless `required`."""
    try:
        return _parse(text, required)
    except ValueError as exc:
        raise UsageError(f"{message(text, str(exc))} ({where})") from None


def message(text: str | None, why: str) -> str:
    return (
        f"Bad SLO {text!r}: {why} - write e.g. {EXAMPLE} "
        f"(keys {', '.join(SLO_KEYS)}; values in ms or s, above 0; comma between bounds)"
    )
