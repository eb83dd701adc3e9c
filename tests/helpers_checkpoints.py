"""Broken copies of a tiny checkpoint, made cheaply (tests/test_integrity.py): every file hard-linked from
the intact one, and the one to break replaced (never written into, so the original stays intact).
Safetensors files are edited as bytes: an 8-byte little-endian header length, the JSON header (dtype,
shape, data_offsets per tensor), then the data."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

WEIGHTS = "model.safetensors"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def derive(src: Path, dest: Path) -> Path:
    """A copy of `src` whose files are hard links: free, and the base stays intact as long as every edit
    replaces a file (rewrite) instead of writing into it."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        os.link(f, dest / f.name)
    return dest


def rewrite(file: Path, data: bytes | str) -> None:
    file.unlink(missing_ok=True)
    file.write_bytes(data.encode() if isinstance(data, str) else data)


def edit_config(ckpt: Path, **values) -> None:
    rewrite(ckpt / "config.json", json.dumps({**json.loads((ckpt / "config.json").read_text()), **values}))


def read_st(file: Path) -> tuple[dict, bytes]:
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def pack_st(header: dict, data: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def tensors(file: Path) -> dict[str, tuple[dict, bytes]]:
    header, data = read_st(file)
    header.pop("__metadata__", None)
    return {n: (m, data[m["data_offsets"][0] : m["data_offsets"][1]]) for n, m in header.items()}


def write_tensors(file: Path, items: dict[str, tuple[dict, bytes]]) -> None:
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, (meta, blob) in items.items():
        header[name] = {**meta, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    rewrite(file, pack_st(header, data))


def edit_tensors(ckpt: Path, edit) -> None:
    """Rewrite model.safetensors with `edit(dict name -> (meta, bytes))` applied."""
    items = tensors(ckpt / WEIGHTS)
    edit(items)
    write_tensors(ckpt / WEIGHTS, items)


def poke(items, name: str, value: bytes, everywhere: bool = False) -> None:
    meta, blob = items[name]
    items[name] = (meta, value * (len(blob) // 2) if everywhere else blob[:6] + value + blob[8:])


def shard(ckpt: Path, mapping=None, drop=None) -> None:
    """Split the weights into two shards with an index; `mapping` edits the index's weight_map, `drop`
    removes tensors from the second shard."""
    items = tensors(ckpt / WEIGHTS)
    (ckpt / WEIGHTS).unlink()
    names = sorted(items)
    half = {SHARDS[0]: names[: len(names) // 2], SHARDS[1]: names[len(names) // 2 :]}
    weight_map = {n: f for f, ns in half.items() for n in ns}
    for f, ns in half.items():
        write_tensors(ckpt / f, {n: items[n] for n in ns if not (drop and f == SHARDS[1] and n in drop)})
    if mapping:
        mapping(weight_map)
    rewrite(ckpt / "model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": weight_map}))


def layer(n: int, ckpt_items, part: str = "") -> list[str]:
    return [k for k in ckpt_items if k.startswith(f"model.layers.{n}.{part}")]
