"""Text samples - calibration, held-out evaluation, bench prompts: a local .txt (one sample per paragraph)
or .jsonl file, or LPX's own text (pipeline/data/)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .config import Calibration, Evaluation
from .errors import UsageError

BUILTIN = "lpx:calibration.txt"
HELDOUT = "lpx:heldout.txt"


@dataclass
class TextSet:
    source: str  # a path, or BUILTIN
    texts: list[str]
    sha256: str


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.replace("\r\n", "\n").split("\n\n") if p.strip()]


def read_texts(path: Path, field: str, key: str, field_key: str) -> tuple[list[str], bytes]:
    """Text samples of a .txt (one per paragraph) or .jsonl (`field` of each line) file, and its bytes.
    `key`/`field_key` name the setting in error messages (e.g. calibration.data, --dataset)."""
    if not path.is_file():
        raise UsageError(
            f"{key}: no file at {path} - give a .txt or .jsonl file, or remove it to use LPX's built-in text"
        )
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{key}: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.suffix != ".jsonl":
        return _paragraphs(content), raw
    texts = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)[field]
        except (ValueError, KeyError, TypeError):
            raise UsageError(
                f"{key}: {path} line {n} is not a JSON object with a '{field}' field - "
                f"fix the line or set {field_key}"
            ) from None
        if isinstance(value, str) and value.strip():
            texts.append(value.strip())
    return texts, raw


def load_texts(cal: Calibration | Evaluation, key: str = "calibration") -> TextSet:
    """Samples from `cal.data`, or from LPX's own text (calibration or held-out) when unset."""
    if cal.data is None:
        builtin = BUILTIN if key == "calibration" else HELDOUT
        raw = resources.files("pipeline.data").joinpath(builtin.split(":", 1)[1]).read_bytes()
        texts, source = _paragraphs(raw.decode("utf-8")), builtin
    else:
        texts, raw = read_texts(Path(cal.data), cal.jsonl_field, f"{key}.data", f"{key}.jsonl_field")
        source = str(cal.data)
    if not texts:
        raise UsageError(f"{key}.data: {source} holds no text samples")
    if len(texts) < cal.samples:
        raise UsageError(
            f"{key}: {source} has {len(texts)} samples but {key}.samples asks for {cal.samples} - "
            f"lower {key}.samples or give a larger {key}.data file"
        )
    return TextSet(source, texts[: cal.samples], hashlib.sha256(raw).hexdigest()[:16])
