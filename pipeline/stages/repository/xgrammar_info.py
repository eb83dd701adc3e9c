"""The engine target's xgrammar tokenizer info: the JSON file upstream's C++ `tensorrtllm` backend reads
to enforce guides (guided_decoding_guide_type / guided_decoding_guide) when its tensorrt_llm config sets
`guided_decoding_backend: xgrammar` and `xgrammar_tokenizer_info_path` to this file.

The format is tests/contracts/xgrammar_tokenizer_info.json's (upstream's reader and writer, with their
commits): one JSON object,

  encoded_vocab   list of strings; entry i is token id i as the tokenizer's vocabulary stores it (e.g.
                  byte-level BPE's "Ġthe"); xgrammar decodes them with the vocabulary type it detects in
                  tokenizer_str. Ids the vocabulary skips are "" (xgrammar never allows those).
  tokenizer_str   the fast tokenizer's tokenizer.json text (tokenizers' Tokenizer.to_str())
  stop_token_ids  list of ints: the ids a finished guided answer may end with

The backend reads all three unconditionally, so LPX writes all three or no file: a tokenizer that has
no fast (tokenizer.json) form, or no end-of-sequence id, leaves guided decoding off (`Unavailable`, with
the reason), and the gateway keeps answering guides with a 400 naming the parameters.

Stop ids are the ids preprocessing ends requests on (pipeline/runtime/model_args.py end_ids: the
checkpoint's generation_config.json / config.json eos_token_id, then the tokenizer's), so a guided answer
may end exactly where an unguided one does. Upstream's own generator writes the tokenizer's single
eos_token_id; the format takes a list.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from ...cache_keys import file_fingerprint
from ...errors import LpxError
from ...inspection.checkpoint import TOKENIZER_FILES
from ...runtime.model_args import end_ids

FILENAME = "xgrammar_tokenizer_info.json"  # beside the engine: tensorrt_llm/1/<FILENAME>
KEYS = ("encoded_vocab", "tokenizer_str", "stop_token_ids")


class Unavailable(LpxError):
    """The tokenizer cannot be described for xgrammar (the message says why and what would fix it)."""


def _load(folder: Path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise Unavailable(f"no tokenizer files in {folder} - pass the folder that holds them")
    try:  # a local folder only: never a download
        tokenizer = AutoTokenizer.from_pretrained(str(folder), use_fast=True, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds for a folder it cannot read
        raise Unavailable(f"the tokenizer in {folder} does not load ({type(exc).__name__}: {exc})") from None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise Unavailable(
            f"the tokenizer in {folder} has no fast form (no tokenizer.json, and transformers cannot "
            "convert it): the backend needs its tokenizer.json text - add tokenizer.json to the checkpoint"
        )
    return tokenizer


def describe(folder: Path) -> dict:
    """The tokenizer info of the tokenizer in `folder` (upstream's three keys)."""
    folder = Path(folder)
    tokenizer = _load(folder)
    vocab = tokenizer.get_vocab()  # token string -> id, added tokens included
    size = max(len(vocab), max(vocab.values(), default=-1) + 1)
    encoded = [""] * size
    for token, token_id in vocab.items():
        encoded[token_id] = token
    stops = [i for i in end_ids(folder, tokenizer) if i < size]
    if not stops:
        raise Unavailable(
            f"the tokenizer in {folder} has no end-of-sequence id (no eos_token_id in generation_config.json, "
            "config.json or the tokenizer) - set eos_token_id in the checkpoint's generation_config.json"
        )
    return {
        "encoded_vocab": encoded,
        "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
        "stop_token_ids": stops,
    }


@lru_cache(maxsize=8)
def _text(folder: str, fingerprint: tuple) -> str:
    del fingerprint  # part of the cache key only: a changed tokenizer file is a new entry
    info = describe(Path(folder))
    content = json.dumps(info, ensure_ascii=False, separators=(",", ":"))
    try:
        content.encode("utf-8")
    except UnicodeEncodeError as exc:  # a token that is no valid Unicode (a lone surrogate)
        raise Unavailable(f"the tokenizer in {folder} has a token that is not valid UTF-8: {exc}") from None
    return content


def text(folder: Path) -> str:
    """The file's JSON text (UTF-8), built once per content of the tokenizer folder."""
    folder = Path(folder)
    files = [folder / n for n in (*TOKENIZER_FILES, "config.json", "generation_config.json")]
    fingerprint = tuple((f.name, tuple(file_fingerprint(f).items())) for f in files if f.is_file())
    return _text(str(folder.resolve()), fingerprint)


def digest(content: str) -> str:
    """The content's sha256 (the repository stage's key holds it)."""
    return hashlib.sha256(content.encode("utf-8")).hexdigest()
