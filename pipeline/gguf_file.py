"""A GGUF file's header (llama.cpp's format), read without its tensor data: what `lpx init --gguf` checks
before the long conversion (pipeline/examples.py). A missing, non-GGUF, wrong-version or truncated file,
and an architecture the installed transformers cannot dequantize, are refused naming the fix.
The magic and version are checked here for messages that say what is wrong; the rest is gguf.GGUFReader's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
# GGUF architectures transformers' loader lists but LPX cannot use (not a causal language model)
NOT_CAUSAL = ("t5", "t5encoder", "umt5")


@dataclass
class GgufInfo:
    """What a GGUF file's header says (no tensor data read)."""

    path: Path
    version: int
    architecture: str
    name: str | None
    eos_token_id: int | None
    eos_token: str | None
    tensors: int
    size: int  # bytes the header's tensors need: the file must be at least this long
    metadata: dict = field(default_factory=dict)  # the scalar keys (arrays left out)


def _field(fields: dict, key: str):
    """A scalar or string metadata value of gguf.GGUFReader's `fields`, None when absent or an array."""
    from gguf import GGUFValueType

    f = fields.get(key)
    if f is None or not f.types or f.types[0] == GGUFValueType.ARRAY:
        return None
    return f.contents()


def _check_head(path: Path) -> int:
    """The file's GGUF version, after its magic; UsageError naming what is wrong otherwise."""
    if not path.is_file():
        raise UsageError(f"--gguf: no file at {path} - pass the path of a .gguf file")
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise UsageError(f"--gguf: cannot read {path} ({exc.strerror or exc})") from None
    # the magic and the version are checked here for messages that say what is wrong; the rest is GGUFReader's
    if head[:4] != GGUF_MAGIC:
        raise UsageError(
            f"--gguf: {path} is not a GGUF file (it starts with {head[:4]!r}, not {GGUF_MAGIC!r}) - "
            "pass a .gguf file (llama.cpp's format)"
        )
    version = struct.unpack("<I", head[4:8])[0] if len(head) == 8 else None
    if version not in GGUF_VERSIONS:
        raise UsageError(
            f"--gguf: {path} is GGUF version {version}; LPX reads versions "
            f"{' and '.join(map(str, GGUF_VERSIONS))} - convert it again with a current llama.cpp"
        )
    return version


def _open_reader(path: Path, size: int):
    """gguf.GGUFReader over the file and the bytes its tensors need; UsageError for a cut or damaged file."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path, "r")
        need = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (ValueError, IndexError, KeyError, struct.error, UnicodeDecodeError) as exc:
        # GGUFReader reads past the end of a cut file as a short array, then fails to shape it
        raise UsageError(
            f"--gguf: {path} is truncated or damaged: its header or tensors do not fit in the file "
            f"({size} bytes; the gguf reader says: {exc}) - download or copy it again"
        ) from None
    except OSError as exc:
        raise UsageError(f"--gguf: cannot read {path} ({exc.strerror or exc})") from None
    if need > size:
        raise UsageError(
            f"--gguf: {path} is truncated: its tensors need {need} bytes, the file has {size} - "
            "download or copy it again"
        )
    return reader, need


def read_gguf(path: Path) -> GgufInfo:
    """The header of the GGUF file at `path` (read by the gguf package's GGUFReader, which maps the file
    and reads its metadata and tensor table, not the tensor data): its architecture, name, end-of-sequence
    token and the size its tensors need. UsageError (naming the file and what is wrong) for a missing,
    non-GGUF, truncated or unreadable file: refused in seconds, before the long load."""
    path = Path(path).expanduser()
    version = _check_head(path)
    reader, need = _open_reader(path, path.stat().st_size)
    fields = reader.fields
    arch = _field(fields, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise UsageError(f"--gguf: {path} names no general.architecture - it is not a model GGUF file")
    eos = _field(fields, "tokenizer.ggml.eos_token_id")
    eos = int(eos) if isinstance(eos, int) else None
    eos_token = None
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is not None and eos is not None and 0 <= eos < len(tokens.data):
        eos_token = tokens.contents(eos)
    name = _field(fields, "general.name")
    meta = {
        key: value
        for key in fields
        if not key.startswith("GGUF.") and (value := _field(fields, key)) is not None
    }
    return GgufInfo(
        path,
        version,
        arch,
        name if isinstance(name, str) else None,
        eos,
        eos_token,
        len(reader.tensors),
        need,
        meta,
    )


def transformers_architecture(architecture: str, name: str | None = None) -> str:
    """The name transformers' GGUF loader files `architecture` under (its own renames, as in
    load_gguf_checkpoint: llama.cpp calls Mistral llama, and qwen2moe is qwen2_moe)."""
    if "llama" in architecture and name and "mistral" in name.lower():
        return "mistral"
    renames = {
        "qwen2moe": "qwen2_moe",
        "gpt-oss": "gpt_oss",
        "qwen3moe": "qwen3_moe",
        "minimax-m2": "minimax_m2",
    }
    return renames.get(architecture, architecture)


def supported_architectures() -> list[str]:
    """The GGUF architectures the installed transformers can dequantize into a causal language model."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer", *NOT_CAUSAL)]


def check_convertible(info: GgufInfo) -> None:
    """UsageError unless transformers can convert `info`'s architecture (checked before the long load)."""
    import transformers

    arch = transformers_architecture(info.architecture, info.name)
    supported = supported_architectures()
    if info.architecture in supported or arch in supported:
        return
    why = (
        "is not a causal language model"
        if arch in NOT_CAUSAL
        else f"is not one transformers {transformers.__version__} can dequantize"
    )
    raise UsageError(
        f"--gguf: {info.path} holds architecture '{info.architecture}', which {why} (causal models it "
        f"converts: {', '.join(sorted(supported))}) - use a GGUF of one of these, or the model's Hugging "
        "Face checkpoint with --checkpoint"
    )
