"""A checkpoint whose config.json disagrees with its weights or its tokenizer is refused before any work
(issue 14, point 4), with both numbers named and the fix: read from the safetensors headers, config.json,
generation_config.json and tokenizer.json, with no weights loaded. Real checkpoints: the published configs
of Llama-3.1-8B, Qwen2.5-0.5B and Mistral-7B-v0.3 on tiny seeded weights with a locally trained tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers_models import write_tiny_model

from pipeline.errors import LpxError
from pipeline.facts.models import PUBLISHED
from pipeline.inspection.checkpoint import inspect_checkpoint, safetensors_header

MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mistral-7b-v0.3")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    base = tmp_path_factory.mktemp("consistency")
    return {name: write_tiny_model(base / name, name) for name in MODELS}


def copy_of(originals, name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(originals[name], dest)
    return dest


def edit_json(file: Path, **values) -> None:
    data = json.loads(file.read_text()) if file.is_file() else {}
    data.update(values)
    file.write_text(json.dumps(data, indent=2))


def config(ckpt: Path) -> dict:
    return json.loads((ckpt / "config.json").read_text())


def refused(ckpt: Path) -> str:
    with pytest.raises(LpxError) as err:
        inspect_checkpoint(ckpt)
    msg = err.value.message
    assert msg.startswith(f"model.checkpoint: {ckpt} is inconsistent, refused before any work")
    return msg


@pytest.mark.parametrize("name", MODELS)
def test_a_consistent_checkpoint_is_accepted(originals, name):
    info = inspect_checkpoint(originals[name])
    header = safetensors_header(info.weights[0])
    rows = header["model.embed_tokens.weight"]["shape"][0]
    assert rows == info.config["vocab_size"], "the stand-in itself must be consistent"
    assert ("lm_head.weight" in header) == (not info.config.get("tie_word_embeddings")), "tied: no lm_head"


@pytest.mark.parametrize("name", MODELS)
def test_published_vocab_size_on_tiny_weights_is_refused(originals, tmp_path, name):
    """The config.json of the real model (its vocab_size) next to weights of another vocabulary."""
    ckpt = copy_of(originals, name, tmp_path)
    rows = config(ckpt)["vocab_size"]
    published = PUBLISHED[name.removesuffix("-v0.3").replace("qwen2.5-0.5b", "qwen2.5-7b")]["vocab_size"]
    edit_json(ckpt / "config.json", vocab_size=published)
    msg = refused(ckpt)
    assert (
        f"config.json has vocab_size {published} but model.embed_tokens.weight in model.safetensors "
        f"has {rows} rows" in msg
    )
    assert f"set vocab_size to {rows}" in msg and "re-download" in msg
    if not config(ckpt).get("tie_word_embeddings"):
        assert f"lm_head.weight in model.safetensors has {rows} rows" in msg


@pytest.mark.parametrize("name", MODELS)
def test_hidden_size_other_than_the_embedding_width_is_refused(originals, tmp_path, name):
    ckpt = copy_of(originals, name, tmp_path)
    width = config(ckpt)["hidden_size"]
    edit_json(ckpt / "config.json", hidden_size=4096)
    msg = refused(ckpt)
    assert (
        f"config.json has hidden_size 4096 but model.embed_tokens.weight in model.safetensors is {width} wide"
        in msg
    )


def test_an_lm_head_of_another_vocabulary_is_refused(originals, tmp_path):
    """Embedding and config agree; lm_head (rewritten as a real safetensors file) has fewer rows."""
    from safetensors.torch import load_file, save_file

    ckpt = copy_of(originals, "llama-3.1-8b", tmp_path)
    tensors = load_file(ckpt / "model.safetensors")
    vocab = tensors["lm_head.weight"].shape[0]
    tensors["lm_head.weight"] = tensors["lm_head.weight"][: vocab - 64].contiguous()
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    msg = refused(ckpt)
    assert (
        f"config.json has vocab_size {vocab} but lm_head.weight in model.safetensors has {vocab - 64} rows"
        in msg
    )
    assert "embed_tokens" not in msg


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    "source,field",
    [
        ("config.json", "eos_token_id"),
        ("config.json", "bos_token_id"),
        ("config.json", "pad_token_id"),
        ("generation_config.json", "eos_token_id"),
        ("generation_config.json", "pad_token_id"),
    ],
)
def test_special_token_ids_outside_the_vocabulary_are_refused(originals, tmp_path, name, source, field):
    ckpt = copy_of(originals, name, tmp_path)
    vocab = config(ckpt)["vocab_size"]
    # Llama-3.1's published eos list, on a vocabulary that does not hold its ids
    bad = [128001, 128008, 128009] if field == "eos_token_id" else vocab
    edit_json(ckpt / source, **{field: bad})
    msg = refused(ckpt)
    first = bad[0] if isinstance(bad, list) else bad
    assert (
        f"{source} has {field} {first}, outside the vocabulary (vocab_size {vocab}: ids 0..{vocab - 1})"
        in msg
    )
    assert f"set {field} in {source}" in msg


def test_negative_ids_are_refused_but_a_pad_of_minus_one_means_none(originals, tmp_path):
    ckpt = copy_of(originals, "mistral-7b-v0.3", tmp_path)
    edit_json(ckpt / "config.json", pad_token_id=-1)
    inspect_checkpoint(ckpt)
    edit_json(ckpt / "config.json", eos_token_id=-2)
    assert "config.json has eos_token_id -2, outside the vocabulary" in refused(ckpt)


@pytest.mark.parametrize("name", MODELS)
def test_a_tokenizer_larger_than_vocab_size_is_refused(originals, tmp_path, name):
    from transformers import AutoTokenizer

    ckpt = copy_of(originals, name, tmp_path)
    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.add_tokens([f"<|reserved_{i}|>" for i in range(10)], special_tokens=True)
    tok.save_pretrained(ckpt)
    vocab = config(ckpt)["vocab_size"]
    assert len(tok) > vocab
    msg = refused(ckpt)
    assert (
        f"the tokenizer (tokenizer.json) has {len(tok)} tokens but config.json has vocab_size {vocab}" in msg
    )
    assert "resize_token_embeddings" in msg


def test_a_separate_tokenizer_folder_is_checked_too(originals, tmp_path):
    """model.tokenizer names another folder: that tokenizer is the one checked against vocab_size."""
    from transformers import AutoTokenizer

    ckpt = copy_of(originals, "mistral-7b-v0.3", tmp_path)
    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.add_tokens([f"<extra_{i}>" for i in range(5)])
    tok.save_pretrained(tmp_path / "tok")
    inspect_checkpoint(ckpt)  # its own tokenizer fits
    with pytest.raises(LpxError) as err:
        inspect_checkpoint(ckpt, tokenizer=tmp_path / "tok")
    vocab = config(ckpt)["vocab_size"]
    want = f"the tokenizer (model.tokenizer {tmp_path / 'tok' / 'tokenizer.json'}) has {len(tok)} tokens"
    assert want in err.value.message and f"vocab_size {vocab}" in err.value.message
    with pytest.raises(LpxError, match="model.tokenizer: no folder at .*holding tokenizer.json"):
        inspect_checkpoint(ckpt, tokenizer=tmp_path / "missing")


def test_a_tokenizer_smaller_than_vocab_size_is_accepted(originals, tmp_path):
    """Padded vocabularies (Qwen2.5: 151936 rows for 151665 tokens) are normal."""
    from safetensors.torch import load_file, save_file

    ckpt = copy_of(originals, "qwen2.5-0.5b", tmp_path)
    tensors = load_file(ckpt / "model.safetensors")
    emb = tensors["model.embed_tokens.weight"]
    import torch

    tensors["model.embed_tokens.weight"] = torch.cat([emb, emb[:64]]).contiguous()
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    edit_json(ckpt / "config.json", vocab_size=emb.shape[0] + 64)
    inspect_checkpoint(ckpt)


def test_a_truncated_safetensors_header_is_named(originals, tmp_path):
    ckpt = copy_of(originals, "llama-3.1-8b", tmp_path)
    (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:100])
    with pytest.raises(LpxError, match="is not a readable safetensors file .*re-download"):
        inspect_checkpoint(ckpt)


def test_lpx_quantize_refuses_it_before_any_work(originals, tmp_path, isolated_home):
    """Through the real CLI: one clear message naming both numbers, exit 1, no traceback, nothing written
    (today's failure: `unexpected RuntimeError: You set ignore_mismatched_sizes to False...`)."""
    ckpt = copy_of(originals, "llama-3.1-8b", tmp_path)
    rows = config(ckpt)["vocab_size"]
    edit_json(ckpt / "config.json", vocab_size=128256)
    cfg = tmp_path / "lpx.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "llama-tiny", "checkpoint": str(ckpt)},
                "variants": [{"name": "fp8", "quantization": {"format": "fp8"}}],
                "build": {"archs": ["sm90"], "target": "torch"},
            }
        )
    )
    for command in ("quantize", "run"):
        res = subprocess.run(
            [sys.executable, "-m", "pipeline", command, "-c", str(cfg)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=300,
        )
        assert res.returncode == 1, res.stderr
        assert "Traceback" not in res.stderr and "unexpected" not in res.stderr
        assert (
            f"vocab_size 128256 but model.embed_tokens.weight in model.safetensors has {rows} rows"
            in res.stderr
        )
        assert not (isolated_home / "artifacts" / "checkpoints").exists()
