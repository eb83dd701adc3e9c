"""The built-in demo: a tiny, seeded Llama checkpoint and the config that runs it end to end.

The checkpoint is a real Hugging Face folder (config.json, model.safetensors, tokenizer.json,
generation_config.json): Llama architecture with grouped-query attention, a byte-level BPE
tokenizer trained here on LPX's own text (so any UTF-8 - Chinese, emoji - round-trips), and
weights briefly trained on the same text so that greedy output looks like language.
"""

from __future__ import annotations

import json
import os
import shutil
from importlib import resources
from pathlib import Path

import yaml

from .artifacts import home
from .atomic import replace_folder
from .facts.models import DEMO_SHAPE

DEMO_NAME = "tiny-llama"
SEED = 1234
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
# A plain chat template, so the demo answers /v1/chat/completions on the OpenAI gateway as a real
# instruction-tuned model's tokenizer would (the tiny model was not trained on it: its answers are noise)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CHECKPOINT_VERSION = 1  # bump when the recipe below changes


def corpus_text() -> str:
    return resources.files("pipeline.data").joinpath("calibration.txt").read_text(encoding="utf-8")


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def _train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=2048,
        chat_template=CHAT_TEMPLATE,
    )


def write_checkpoint(dest: Path, train_steps: int = 150) -> Path:
    """Write the tiny checkpoint into `dest` (atomically: a half-written folder is never left)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        torch.manual_seed(SEED)
        texts = paragraphs(corpus_text())
        tokenizer = _train_tokenizer(texts, vocab_size=DEMO_SHAPE["vocab_size"])
        config = LlamaConfig(
            **{**DEMO_SHAPE, "vocab_size": len(tokenizer)},  # grouped-query attention: 2 KV heads for 4
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            architectures=["LlamaForCausalLM"],
        )
        model = LlamaForCausalLM(config)
        _train(model, tokenizer, texts, train_steps)
        model = model.to(torch.bfloat16)
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
            do_sample=False,
        )
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "lpx_demo.json").write_text(json.dumps({"version": CHECKPOINT_VERSION, "seed": SEED}) + "\n")
        # the old checkpoint stays until the new one is whole (before, it was deleted first: a run killed
        # between the two steps left none)
        replace_folder(tmp, dest, dest.with_name(f".{dest.name}.old-{os.getpid()}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _train(model, tokenizer, texts: list[str], steps: int) -> None:
    """A few hundred steps of next-token training on the shipped text, seeded."""
    import torch

    ids = []
    for t in texts:
        ids.extend(tokenizer(t)["input_ids"] + [tokenizer.eos_token_id])
    data = torch.tensor(ids)
    seq, batch = 64, 16
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
        x = torch.stack([data[s : s + seq] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def demo_dir() -> Path:
    return home() / "demo"


def ensure_checkpoint(dest: Path | None = None) -> Path:
    """Write the demo checkpoint once; reuse it while its recipe version matches."""
    dest = Path(dest or demo_dir() / "checkpoint")
    marker = dest / "lpx_demo.json"
    try:
        if (
            json.loads(marker.read_text())["version"] == CHECKPOINT_VERSION
            and (dest / "config.json").is_file()
        ):
            return dest
    except (OSError, ValueError, KeyError):
        pass
    return write_checkpoint(dest)


# `lpx init DIR --tune`: the demo with a second variant and a small `lpx tune` search (CPU minutes)
TUNE_VARIANT = {"name": "bf16", "quantization": {"format": "none", "kv_cache": "none"}}
TUNE_SECTION = {
    "slo": "ttft=500ms,itl=50ms",
    "input_len": 64,
    "output_len": 32,
    "requests_per_level": 16,
    "warmup": 2,
    "max_concurrency": 16,
    "rate_steps": 3,
    "grid": {"max_batch_size": [2, 8], "max_num_tokens": [256, 2048]},
}


def demo_config_dict(checkpoint: str = "checkpoint", tune: bool = False) -> dict:
    cfg = _demo_config(checkpoint)
    if tune:
        cfg["variants"].append(TUNE_VARIANT)
        cfg["tune"] = TUNE_SECTION
    return cfg


def _demo_config(checkpoint: str) -> dict:
    return {
        "model": {"name": DEMO_NAME, "checkpoint": checkpoint},
        "variants": [{"name": "fp8", "quantization": {"format": "fp8", "kv_cache": "none"}}],
        "calibration": {"samples": 16, "seq_len": 64, "batch_size": 4},
        "build": {
            "target": "torch",
            "archs": ["sm90"],
            "dtype": "bfloat16",
            "max_batch_size": 8,
            "max_input_len": 512,
            "max_seq_len": 1024,
            "max_num_tokens": 4096,
        },
        "serving": {
            "host": "127.0.0.1",
            "http_port": 0,
            "grpc_port": 0,
            "metrics_port": 0,
            "max_tokens_cap": 512,
        },
    }


DEMO_PROMPT = "The first token of an answer"


def write_demo_config(folder: Path, tune: bool = False) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lpx.yaml"
    header = (
        "# LPX demo config: a tiny Llama quantized to FP8, served by LPX's torch reference engine.\n"
        "# Edit and run: lpx run -c lpx.yaml   (lpx config schema prints every key)\n"
    )
    path.write_text(header + yaml.safe_dump(demo_config_dict(tune=tune), sort_keys=False), encoding="utf-8")
    return path


def ensure_demo(report=None) -> Path:
    """The demo's config and checkpoint under $LPX_HOME/demo, written on first use."""
    folder = demo_dir()
    ckpt = folder / "checkpoint"
    if not (ckpt / "lpx_demo.json").is_file() and report is not None:
        report.info(f"writing the demo checkpoint (seeded, ~15 s) to {ckpt}")
    ensure_checkpoint(ckpt)
    path = folder / "lpx.yaml"
    if not path.is_file():
        write_demo_config(folder)
    return path
