"""Calibration samples: a local .txt (one sample per paragraph) or .jsonl file, or LPX's own text."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .config import Calibration
from .errors import PipelineError

BUILTIN = "lpx:calibration.txt"


@dataclass
class CalibrationSet:
    source: str  # a path, or BUILTIN
    texts: list[str]
    sha256: str


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.replace("\r\n", "\n").split("\n\n") if p.strip()]


def load_texts(cal: Calibration) -> CalibrationSet:
    if cal.data is None:
        raw = resources.files("pipeline.data").joinpath("calibration.txt").read_bytes()
        texts, source = _paragraphs(raw.decode("utf-8")), BUILTIN
    else:
        path = Path(cal.data)
        if not path.is_file():
            raise PipelineError(f"calibration.data: no file at {path} - give a .txt or .jsonl file, or remove the key "
                                "to use LPX's built-in text", exit_code=2)
        raw = path.read_bytes()
        source = str(path)
        try:
            content = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PipelineError(f"calibration.data: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})", 2) from None
        if path.suffix == ".jsonl":
            texts = []
            for n, line in enumerate(content.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    value = row[cal.jsonl_field]
                except (ValueError, KeyError, TypeError):
                    raise PipelineError(
                        f"calibration.data: {path} line {n} is not a JSON object with a '{cal.jsonl_field}' field - "
                        "fix the line or set calibration.jsonl_field", exit_code=2) from None
                if isinstance(value, str) and value.strip():
                    texts.append(value.strip())
        else:
            texts = _paragraphs(content)
    if not texts:
        raise PipelineError(f"calibration.data: {source} holds no text samples", exit_code=2)
    if len(texts) < cal.samples:
        raise PipelineError(
            f"calibration: {source} has {len(texts)} samples but calibration.samples asks for {cal.samples} - "
            "lower calibration.samples or give a larger calibration.data file", exit_code=2)
    return CalibrationSet(source, texts[: cal.samples], hashlib.sha256(raw).hexdigest()[:16])


def batches(tokenizer, texts: list[str], seq_len: int, batch_size: int):
    """Tokenized batches (input_ids, attention_mask), each sample truncated to seq_len tokens."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i : i + batch_size], return_tensors="pt", padding=True, truncation=True,
                        max_length=seq_len)
        yield enc["input_ids"], enc["attention_mask"]
