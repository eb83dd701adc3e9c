"""Inspect a Hugging Face checkpoint folder before any heavy work, and refuse what is unsafe or inconsistent.

Consistency is read from metadata only, no weights loaded: each .safetensors file's JSON header (its first
8 bytes are the header's length), config.json, generation_config.json and tokenizer.json. Refused: a
vocab_size other than the embedding's (and lm_head's) rows, a hidden_size other than the embedding's
width, special-token ids outside the vocabulary, and a tokenizer with more tokens than vocab_size."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import LpxError
from .integrity import (
    INDEX_FILE,
    check_config_types,
    check_data,
    check_layers,
    check_shards,
    shard_files,
)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)


@dataclass
class CheckpointInfo:
    path: Path
    config: dict
    weights: list[Path]
    pickle_only: bool

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or ["?"])[0]

    @property
    def num_heads(self) -> int:
        return int(self.config.get("num_attention_heads", 0))

    @property
    def num_kv_heads(self) -> int:
        return int(self.config.get("num_key_value_heads") or self.num_heads)

    @property
    def max_positions(self) -> int | None:
        v = self.config.get("max_position_embeddings")
        return int(v) if v else None


def inspect_checkpoint(
    path: Path, allow_pickle: bool = False, key: str = "model.checkpoint", tokenizer: Path | None = None
) -> CheckpointInfo:
    """Check a checkpoint folder before any work (and its tokenizer: `tokenizer`, the separate folder
    model.tokenizer names, else the checkpoint's own)."""
    path = Path(path)
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise LpxError(
            f"model.tokenizer: no folder at {tokenizer} - point it at the folder holding tokenizer.json, "
            "or remove it to use the checkpoint's own tokenizer"
        )
    if not path.exists():
        raise LpxError(
            f"{key}: no checkpoint folder at {path} - point {key} at a local Hugging Face checkpoint"
        )
    if not path.is_dir():
        raise LpxError(f"{key}: {path} is a file; {key} must be the checkpoint folder that holds config.json")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise LpxError(
            f"{key}: {path} has no config.json - is this a Hugging Face checkpoint folder? "
            "(download it with 'huggingface-cli download' or write it with save_pretrained)"
        )
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise LpxError(f"{key}: {cfg_file} is not valid JSON ({exc}) - re-download the checkpoint") from None
    check_config_types(config, cfg_file, key)
    safetensors, weight_map = shard_files(path, key)
    pickles = sorted(p for p in path.glob("*.bin") if p.name != "training_args.bin") + sorted(
        path.glob("*.pt")
    )
    if not safetensors and not pickles:
        raise LpxError(f"{key}: {path} holds no weights (*.safetensors) - the download may be incomplete")
    pickle_only = not safetensors
    if pickle_only and not allow_pickle:
        raise LpxError(
            f"{key}: {path} has only pickle weights ({pickles[0].name}), which can run arbitrary code when loaded. "
            "Convert them to safetensors, or set model.allow_pickle: true if you trust the source"
        )
    check_consistency(path, config, safetensors, key, tokenizer)
    if safetensors:
        shapes = tensor_shapes(safetensors, key)
        if weight_map is not None:
            check_shards(path / INDEX_FILE, weight_map, shapes)
        check_layers(config, shapes, key)
    return CheckpointInfo(path, config, safetensors or pickles, pickle_only)


MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def safetensors_header(file: Path, key: str = "model.checkpoint") -> dict:
    """The JSON header of one .safetensors file (tensor name -> dtype, shape, offsets); no weights read."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > MAX_HEADER or n > size - 8:
                raise ValueError(f"header length {n} in a file of {size} bytes")
            header = json.loads(fh.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError, RecursionError) as exc:
        raise LpxError(
            f"{key}: {file} is not a readable safetensors file ({exc}) - the download may be incomplete; "
            "re-download it"
        ) from None
    check_data(file, header, n, size, key)
    return header


def tensor_shapes(files: list[Path], key: str = "model.checkpoint") -> dict[str, tuple[str, list[int], str]]:
    """tensor name -> (dtype, shape, file name), over every shard."""
    shapes = {}
    for f in files:
        for name, meta in safetensors_header(f, key).items():
            if name != "__metadata__" and isinstance(meta, dict):
                shapes[name] = (str(meta.get("dtype")), list(meta.get("shape") or []), f.name)
    return shapes


def tokenizer_size(folder: Path) -> tuple[int, str] | None:
    """(len(tokenizer), the file it was read from): the number of token ids the tokenizer can produce, the
    highest id + 1, from tokenizer.json (or vocab.json + added_tokens.json); None where neither exists."""
    ids: set[int] = set()
    tj = folder / "tokenizer.json"
    try:
        if tj.is_file():
            data = json.loads(tj.read_text(encoding="utf-8"))
            vocab = (data.get("model") or {}).get("vocab") or {}
            ids.update(vocab.values() if isinstance(vocab, dict) else range(len(vocab)))  # unigram: a list
            ids.update(t["id"] for t in data.get("added_tokens") or [] if isinstance(t, dict) and "id" in t)
            source = tj.name
        elif (folder / "vocab.json").is_file():
            ids.update(json.loads((folder / "vocab.json").read_text(encoding="utf-8")).values())
            added = folder / "added_tokens.json"
            if added.is_file():
                ids.update(json.loads(added.read_text(encoding="utf-8")).values())
            source = "vocab.json"
        else:
            return None
    except (OSError, ValueError, TypeError, KeyError):
        return None  # an unreadable tokenizer is the tokenizer loader's to report
    ints = [i for i in ids if isinstance(i, int)]
    return (max(max(ints) + 1, len(ints)), source) if ints else None


def _special_ids(cfg: dict) -> list[tuple[str, int]]:
    out = []
    for name in SPECIAL_IDS:
        v = cfg.get(name)
        for i in v if isinstance(v, list) else [v]:
            if isinstance(i, int) and not isinstance(i, bool):
                out.append((name, i))
    return out


def check_consistency(
    path: Path,
    config: dict,
    safetensors: list[Path],
    key: str = "model.checkpoint",
    tokenizer: Path | None = None,
) -> None:
    """Refuse, before any work, a checkpoint whose config.json disagrees with its weights or its tokenizer,
    naming both numbers and the fix (what loading it would otherwise fail on, or silently get wrong)."""
    c = config.get("text_config") or config
    vocab, hidden = c.get("vocab_size"), c.get("hidden_size")
    vocab = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None
    hidden = hidden if isinstance(hidden, int) and not isinstance(hidden, bool) else None
    problems = []
    shapes = tensor_shapes(safetensors, key) if safetensors else {}
    embed = next((n for n in sorted(shapes) if n.endswith(EMBEDDING_SUFFIXES)), None)
    heads = [n for n in sorted(shapes) if n == "lm_head.weight" or n.endswith(".lm_head.weight")]
    for name in [embed, *heads] if embed else heads:
        dtype, shape, file = shapes[name]
        if len(shape) != 2 or vocab is None:
            continue
        if shape[0] != vocab:
            problems.append(
                f"config.json has vocab_size {vocab} but {name} in {file} has {shape[0]} rows - the config and "
                f"the weights come from different models: re-download the checkpoint, or set vocab_size to "
                f"{shape[0]} if the weights are the right ones"
            )
        if name == embed and hidden is not None and dtype in FLOAT_DTYPES and shape[1] != hidden:
            problems.append(
                f"config.json has hidden_size {hidden} but {name} in {file} is {shape[1]} wide - the config and "
                "the weights come from different models: re-download the checkpoint"
            )
    if vocab is not None:
        for source, cfg in (
            ("config.json", c),
            ("generation_config.json", _json(path / "generation_config.json")),
        ):
            for name, i in _special_ids(cfg):
                if i >= vocab or (i < 0 and not (name == "pad_token_id" and i == -1)):
                    problems.append(
                        f"{source} has {name} {i}, outside the vocabulary (vocab_size {vocab}: ids 0..{vocab - 1}) - "
                        f"set {name} in {source} to the id the tokenizer gives that token"
                    )
        tok = tokenizer_size(Path(tokenizer) if tokenizer is not None else path)
        if tok is not None and tok[0] > vocab:
            where = tok[1] if tokenizer is None else f"model.tokenizer {Path(tokenizer) / tok[1]}"
            problems.append(
                f"the tokenizer ({where}) has {tok[0]} tokens but config.json has vocab_size {vocab}, so ids "
                f"{vocab}..{tok[0] - 1} have no embedding - use the tokenizer that belongs to these weights, or "
                "resize the embeddings (model.resize_token_embeddings) and save the checkpoint again"
            )
    if problems:
        raise LpxError(
            f"{key}: {path} is inconsistent, refused before any work:\n"
            + "\n".join(f"  {p}" for p in problems)
        )


def _json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def copy_tokenizer(src: Path, dest: Path) -> list[str]:
    """Copy the tokenizer (and generation config) files that exist in `src` into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        f = Path(src) / name
        if f.is_file():
            shutil.copy2(f, dest / name)
            copied.append(name)
    if "tokenizer.json" not in copied and "tokenizer.model" not in copied and "vocab.json" not in copied:
        raise LpxError(
            f"No tokenizer files in {src} - set model.tokenizer to the folder that holds tokenizer.json"
        )
    return copied
