"""A checkpoint's files checked for integrity before any work, from metadata only (no weights read): the
types of config.json's fields, the shard index (model.safetensors.index.json) against the shards' headers,
the data length each safetensors header promises, the layer indices in the tensor names against
num_hidden_layers, and (for the quantize stage, before it loads anything) the tokenizer's files. Each
refusal names the file and the fix (LPX issue 23).

What needs the model's own parameter list (missing / unexpected / mis-shaped tensors against the model
config.json describes, built on the meta device) is pipeline/stages/quantize/integrity.py: it needs torch
and transformers, which this module does not import."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..errors import LpxError

INDEX_FILE = "model.safetensors.index.json"
# bytes per element of each safetensors dtype (safetensors' Dtype); others are only bounds-checked
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
    "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip
# config.json fields that transformers reads as numbers: a string ("2") or a bool there is refused
INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "head_dim",
)
FLOAT_FIELDS = ("rms_norm_eps", "layer_norm_eps", "rope_theta")
# a layer's index in a tensor name: model.layers.3.mlp..., transformer.h.3.attn..., encoder.layer.3....
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")
TOKENIZER_MODELS = ("tokenizer.json", "tokenizer.model", "vocab.json")
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FIRST = 5  # names listed in a message


def names(items, first: int = FIRST) -> str:
    """'a, b, c (+4 more)': the first few of `items`, sorted."""
    items = sorted(items)
    more = f" (+{len(items) - first} more)" if len(items) > first else ""
    return ", ".join(items[:first]) + more


def _kind(v) -> str:
    return {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}.get(
        type(v), type(v).__name__
    )


def check_config_types(config, cfg_file: Path, key: str) -> None:
    """config.json is a JSON object whose size fields are positive integers and whose numerics fields are
    numbers; model_type a string and architectures a list of strings."""
    if not isinstance(config, dict):
        raise LpxError(
            f"{key}: {cfg_file} holds {_kind(config)}, not a JSON object - config.json is damaged or is "
            "another file: re-download it (or write it with save_pretrained)"
        )
    c = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    problems = []
    for name in INT_FIELDS:
        v = c.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            fix = f"write it as {v.strip()} (no quotes)" if isinstance(v, str) and v.strip().isdigit() else ""
            problems.append(
                f"{name} is {json.dumps(v)} ({_kind(v)}), must be a positive integer{' - ' + fix if fix else ''}"
            )
    for name in FLOAT_FIELDS:
        v = c.get(name)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0):
            problems.append(f"{name} is {json.dumps(v)} ({_kind(v)}), must be a positive number")
    if "model_type" in config and not isinstance(config["model_type"], str):
        problems.append(
            f'model_type is {json.dumps(config.get("model_type"))}, must name the model (e.g. "llama")'
        )
    arch = config.get("architectures")
    if arch is not None and not (isinstance(arch, list) and arch and all(isinstance(a, str) for a in arch)):
        problems.append(
            f'architectures is {json.dumps(arch)}, must be a list of class names (e.g. ["LlamaForCausalLM"])'
        )
    if problems:
        raise LpxError(
            f"{key}: {cfg_file} has fields of the wrong type, refused before any work:\n"
            + "\n".join(f"  {p}" for p in problems)
            + "\n  fix config.json (compare it with the model's published config.json) or re-download it"
        )


def check_data(file: Path, header: dict, header_len: int, size: int, key: str) -> None:
    """Every tensor's data_offsets lie inside the file's data and span its dtype x shape bytes: a file cut
    short after its header (an interrupted download) is refused here, not half-read later."""
    data = size - 8 - header_len
    end, bad = 0, []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in meta["data_offsets"])
            shape = [int(d) for d in meta["shape"]]
            dtype = str(meta["dtype"])
        except (KeyError, TypeError, ValueError):
            bad.append(f"{name}: no valid dtype / shape / data_offsets")
            continue
        if not 0 <= begin <= stop:
            bad.append(f"{name}: data_offsets [{begin}, {stop}]")
        elif dtype in DTYPE_BYTES and stop - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            bad.append(f"{name}: {stop - begin} bytes for {dtype} {shape}")
        end = max(end, stop)
    if bad:
        raise LpxError(
            f"{key}: {file} has a damaged safetensors header ({len(bad)} tensor(s): {names(bad, 3)}) - "
            "re-download the file"
        )
    if end > data:
        raise LpxError(
            f"{key}: {file} is truncated: its header maps {end} bytes of tensor data but the file holds "
            f"{max(data, 0)} ({end - data} missing) - the download stopped early; re-download the file"
        )
    if end < data:
        raise LpxError(
            f"{key}: {file} holds {data - end} bytes after the last tensor its header names - the file is "
            "damaged (or two files were joined); re-download it"
        )


def shard_files(path: Path, key: str) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files transformers loads and the index's weight_map (tensor -> shard), or None
    unsharded. With an index, the shards are the ones it names, and every one must exist."""
    index = path / INDEX_FILE
    if not index.is_file():
        # transformers loads model.safetensors alone when it exists (Mistral's repos also ship
        # consolidated.safetensors, in another naming, for other tools)
        single = path / "model.safetensors"
        return ([single] if single.is_file() else sorted(path.glob("*.safetensors"))), None
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise ValueError("weight_map is not an object of tensor name -> file name")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise LpxError(
            f"{key}: {index} is not a valid shard index ({type(exc).__name__}: {exc}) - re-download it"
        ) from None
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not (path / s).is_file()]
    if missing:
        raise LpxError(
            f"{key}: {index} names {len(missing)} shard(s) that are not in {path}: {names(missing)} - "
            "the download is incomplete; download the missing shard(s)"
        )
    return [path / s for s in shards], weight_map


def check_shards(index: Path, weight_map: dict[str, str], shapes: dict) -> None:
    """Every tensor the index maps is in the shard it names (shapes: name -> (dtype, shape, file))."""
    absent = [n for n in weight_map if n not in shapes]
    moved = [
        f"{n} ({weight_map[n]} -> {shapes[n][2]})"
        for n in weight_map
        if n in shapes and shapes[n][2] != weight_map[n]
    ]
    if absent:
        raise LpxError(
            f"model.checkpoint: {index} maps {len(absent)} tensor(s) that no shard holds: {names(absent)} - "
            "a shard is incomplete or from another download; re-download the checkpoint"
        )
    if moved:
        raise LpxError(
            f"model.checkpoint: {index} maps {len(moved)} tensor(s) to a shard that does not hold them: "
            f"{names(moved, 3)} - the index and the shards come from different downloads; re-download the index"
        )


def check_layers(config: dict, shapes: dict, key: str) -> None:
    """num_hidden_layers agrees with the layer indices in the tensor names: layers 0..n-1, none missing."""
    c = config.get("text_config") or config
    n = c.get("num_hidden_layers")
    found = {int(m.group(1)) for name in shapes for m in [LAYER_INDEX.search(name)] if m}
    if not isinstance(n, int) or not found:
        return
    extra = int(c.get("num_nextn_predict_layers") or 0)  # DeepSeek's multi-token-prediction layers
    files = names({v[2] for v in shapes.values()}, 2)
    have = (
        f"layers {min(found)}..{max(found)}"
        if found == set(range(min(found), max(found) + 1))
        else f"layers {names(map(str, found), 8)}"
    )
    if max(found) + 1 > n + extra:
        raise LpxError(
            f"{key}: config.json declares num_hidden_layers {n} but the weights ({files}) hold {have} "
            f"({len(found)} layer(s)) - the config and the weights come from different models: set "
            f"num_hidden_layers to {max(found) + 1} if the weights are the right ones, or re-download config.json"
        )
    missing = sorted(set(range(n)) - found)
    if missing:
        raise LpxError(
            f"{key}: config.json declares num_hidden_layers {n} but the weights ({files}) hold {have} "
            f"({len(found)} layer(s); missing: {names(map(str, missing), 8)}) - re-download the checkpoint "
            f"(a shard may be missing), or set num_hidden_layers to {len(found)} if the model really has that many"
        )


def check_tokenizer_files(folder: Path, where: str) -> None:
    """The tokenizer folder holds a tokenizer model file, and its JSON files parse as JSON objects."""
    if not any((folder / f).is_file() for f in TOKENIZER_MODELS):
        raise LpxError(
            f"{where}: {folder} has no tokenizer ({' / '.join(TOKENIZER_MODELS)}) - copy the tokenizer files "
            "of this model into it, or set model.tokenizer to the folder that holds tokenizer.json"
        )
    for name in TOKENIZER_JSON:
        f = folder / name
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LpxError(
                f"{where}: {f} is not valid JSON ({exc}) - the file is damaged; re-download it"
            ) from None
        if not isinstance(data, dict):
            raise LpxError(f"{where}: {f} holds {_kind(data)}, not a JSON object - re-download it")
