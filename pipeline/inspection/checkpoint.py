"""Inspect a Hugging Face checkpoint folder before any heavy work, and refuse what is unsafe."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import LpxError

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
    path: Path, allow_pickle: bool = False, key: str = "model.checkpoint"
) -> CheckpointInfo:
    path = Path(path)
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
    except ValueError as exc:
        raise LpxError(f"{key}: {cfg_file} is not valid JSON ({exc}) - re-download the checkpoint") from None
    safetensors = sorted(path.glob("*.safetensors"))
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
    return CheckpointInfo(path, config, safetensors or pickles, pickle_only)


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
