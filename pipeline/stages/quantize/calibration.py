"""Calibration samples: a local .txt (one sample per paragraph) or .jsonl file, or LPX's own text."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ...config import Calibration, Evaluation
from ...errors import PipelineError

BUILTIN = "lpx:calibration.txt"
HELDOUT = "lpx:heldout.txt"


@dataclass
class CalibrationSet:
    source: str  # a path, or BUILTIN
    texts: list[str]
    sha256: str


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.replace("\r\n", "\n").split("\n\n") if p.strip()]


def read_texts(path: Path, field: str, key: str, field_key: str) -> tuple[list[str], bytes]:
    """Text samples of a .txt (one per paragraph) or .jsonl (`field` of each line) file, and its bytes.
    `key`/`field_key` name the setting in error messages (e.g. calibration.data, --dataset)."""
    if not path.is_file():
        raise PipelineError(
            f"{key}: no file at {path} - give a .txt or .jsonl file, or remove it to use LPX's built-in text",
            exit_code=2,
        )
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PipelineError(
            f"{key}: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})", 2
        ) from None
    if path.suffix != ".jsonl":
        return _paragraphs(content), raw
    texts = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)[field]
        except (ValueError, KeyError, TypeError):
            raise PipelineError(
                f"{key}: {path} line {n} is not a JSON object with a '{field}' field - "
                f"fix the line or set {field_key}",
                exit_code=2,
            ) from None
        if isinstance(value, str) and value.strip():
            texts.append(value.strip())
    return texts, raw


def load_texts(cal: Calibration | Evaluation, key: str = "calibration") -> CalibrationSet:
    """Samples from `cal.data`, or from LPX's own text (calibration or held-out) when unset."""
    if cal.data is None:
        builtin = BUILTIN if key == "calibration" else HELDOUT
        raw = resources.files("pipeline.data").joinpath(builtin.split(":", 1)[1]).read_bytes()
        texts, source = _paragraphs(raw.decode("utf-8")), builtin
    else:
        texts, raw = read_texts(Path(cal.data), cal.jsonl_field, f"{key}.data", f"{key}.jsonl_field")
        source = str(cal.data)
    if not texts:
        raise PipelineError(f"{key}.data: {source} holds no text samples", exit_code=2)
    if len(texts) < cal.samples:
        raise PipelineError(
            f"{key}: {source} has {len(texts)} samples but {key}.samples asks for {cal.samples} - "
            f"lower {key}.samples or give a larger {key}.data file",
            exit_code=2,
        )
    return CalibrationSet(source, texts[: cal.samples], hashlib.sha256(raw).hexdigest()[:16])


def batches(tokenizer, texts: list[str], seq_len: int, batch_size: int):
    """Tokenized batches (input_ids, attention_mask), each sample truncated to seq_len tokens."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[i : i + batch_size], return_tensors="pt", padding=True, truncation=True, max_length=seq_len
        )
        yield enc["input_ids"], enc["attention_mask"]
