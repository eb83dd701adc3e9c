"""`lpx plan`: weights, KV cache, fit and decode roofline for a model on a GPU, per format.

Arithmetic only: no GPU, no download. The model comes from a checkpoint's config.json, a
config.json file, or a preset written from the models' published configs.

Weights: linear layers of the decoder are quantized; embeddings, lm_head (ModelOpt leaves it in
high precision by default), norms and biases stay in bf16. Scales counted per format:
fp8 per-tensor fp32 weight + activation scales; int4_awq 4-bit weights + one bf16 scale per
128-element group + a per-input-channel pre-quant scale; w4a8_awq the same + per-tensor fp32
scales; int8_sq int8 weights + per-output-channel fp32 scales + per-input smoothing scales;
nvfp4 4-bit weights + one FP8 scale per 16-element block + per-tensor fp32 global scales.
A tied lm_head is counted once. KV cache per token = 2 x layers x kv_heads x head_dim x bytes.
Fit: (GPU memory - weights - RUNTIME_OVERHEAD) x kv_fraction is the KV pool; a sequence takes
its length rounded up to whole 64-token blocks. Roofline: one decode step reads all weights plus
the KV of every sequence at full length: tokens/s = batch x bandwidth / bytes per step, at batch 1
and at the fitting batch (capped at 256). Suggested max_batch_size: that batch rounded down to a
power of two; max_num_tokens: room for it plus one prefill chunk of min(seq_len, 8192), in 1024s.

JSON fields (`lpx plan --json`):
  model: name, layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied_embeddings, params
  gpu: key, name, memory_bytes, bandwidth_bytes_per_s, sm, fp8, nvfp4, source (null without --gpu)
  kv_cache_dtype, kv_bytes_per_token {bf16, fp8, int8}, seq_len, max_seq_len, kv_fraction,
  runtime_overhead_bytes, warnings [str]
  formats[]: format, weight_bytes, quantized_bytes, high_precision_bytes, scale_bytes,
    runs_on_gpu, kv_pool_bytes, fit_sequences, fit_sequences_at_max_seq_len,
    tokens_per_s_batch1, tokens_per_s_at_fit, suggested_max_batch_size, suggested_max_num_tokens
    (the fit, speed and suggestion fields are null without --gpu or when the weights do not fit)
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UsageError
from ..facts.formats import FORMATS, refusal
from ..facts.gpu import Gpu
from ..facts.models import PRESETS as PRESET_NAMES
from ..facts.models import PUBLISHED

KV_BYTES = {"bf16": 2, "fp8": 1, "int8": 1}
AWQ_GROUP = 128
NVFP4_BLOCK = 16
TOKENS_PER_BLOCK = 64
MAX_BATCH = 256  # cap for the fitting batch and the suggested max_batch_size
RUNTIME_OVERHEAD = 2 * 1024**3  # CUDA context, activations and runtime buffers: an assumption, not measured
GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = False

    def linears(self) -> list[tuple[int, int]]:
        """(in_features, out_features) of the quantized linear layers of one decoder layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    @property
    def params(self) -> int:
        linear = self.layers * sum(a * b for a, b in self.linears())
        return linear + self.high_precision_params()

    def high_precision_params(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        norms = (2 * self.layers + 1) * self.hidden
        bias = self.layers * (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return embed + norms + bias


def shape_from_config(cfg: dict, name: str) -> ModelShape:
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return ModelShape(
            name=name,
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab=int(cfg["vocab_size"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        )
    except KeyError as exc:
        raise UsageError(
            f"{name}: config.json has no {exc.args[0]} - pass a decoder-only "
            f"HF config (Llama/Qwen2/Mistral style) or use --preset"
        ) from None


# From the models' published config.json files on the Hugging Face Hub (pipeline/facts/models.py).
PRESETS: dict[str, ModelShape] = {name: shape_from_config(PUBLISHED[name], name) for name in PRESET_NAMES}


def load_shape(checkpoint: Path | None, model_config: Path | None, preset: str | None) -> ModelShape:
    given = [x for x in (checkpoint, model_config, preset) if x is not None]
    if len(given) != 1:
        raise UsageError(
            "give exactly one of --checkpoint DIR, --model-config FILE or --preset NAME "
            f"(presets: {', '.join(PRESETS)})"
        )
    if preset is not None:
        if preset.lower() not in PRESETS:
            raise UsageError(f"unknown preset '{preset}' - use one of: {', '.join(PRESETS)}")
        return PRESETS[preset.lower()]
    path = checkpoint / "config.json" if checkpoint is not None else model_config
    assert path is not None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot read {path}: {exc} - point at a HF checkpoint folder or its config.json"
        ) from None
    return shape_from_config(cfg.get("text_config", cfg), (checkpoint or path.parent).name)


def weight_bytes(m: ModelShape, fmt: str) -> dict[str, int]:
    """quantized_bytes (weights of the quantized linears), scale_bytes, high_precision_bytes, weight_bytes."""
    quant = scales = 0
    for fin, fout in m.linears():
        n = fin * fout
        if fmt == "none":
            quant += 2 * n
        elif fmt == "fp8":
            quant += n
            scales += 4 + 4
        elif fmt in ("int4_awq", "w4a8_awq"):
            quant += n // 2
            scales += math.ceil(fin / AWQ_GROUP) * fout * 2 + fin * 2
            scales += 8 if fmt == "w4a8_awq" else 0
        elif fmt == "int8_sq":
            quant += n
            scales += fout * 4 + fin * 2 + 4
        elif fmt == "nvfp4":
            quant += n // 2
            scales += math.ceil(n / NVFP4_BLOCK) + 4 + 4
        else:
            raise UsageError(f"unknown format '{fmt}' - use one of: {', '.join(FORMATS)}")
    quant, scales = quant * m.layers, scales * m.layers
    high = 2 * m.high_precision_params()
    return {
        "quantized_bytes": quant,
        "scale_bytes": scales,
        "high_precision_bytes": high,
        "weight_bytes": quant + scales + high,
    }


def kv_bytes_per_token(m: ModelShape, dtype: str = "bf16") -> int:
    return 2 * m.layers * m.kv_heads * m.head_dim * KV_BYTES[dtype]


def _blocks(tokens: int) -> int:
    return math.ceil(tokens / TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK


def pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def decode_tokens_per_s(batch: int, weights: int, kv_per_sequence: int, gpu: Gpu) -> float:
    """Roofline: a decode step reads every weight once plus each sequence's KV cache."""
    return batch * gpu.bandwidth_bytes_per_s / (weights + batch * kv_per_sequence) if batch else 0.0


def plan(
    m: ModelShape,
    gpu: Gpu | None,
    seq_len: int = 2048,
    kv_fraction: float = 0.9,
    max_seq_len: int | None = None,
    kv_dtype: str = "bf16",
) -> dict:
    """Everything `lpx plan` shows, as the documented JSON structure."""
    max_seq_len = max_seq_len or seq_len
    per_token = kv_bytes_per_token(m, kv_dtype)
    warnings: list[str] = []
    rows = [
        _format_row(m, fmt, gpu, seq_len, max_seq_len, kv_fraction, per_token, warnings) for fmt in FORMATS
    ]
    if max_seq_len >= 2 * seq_len:
        warnings.append(
            f"max_seq_len {max_seq_len} is {max_seq_len / seq_len:.0f}x the expected {seq_len} tokens: "
            "a scheduler that reserves max_seq_len per request (guaranteed_no_evict) admits "
            f"{max_seq_len / seq_len:.0f}x fewer sequences - lower max_seq_len to what requests need"
        )
    return {
        "model": {**{k: v for k, v in asdict(m).items() if k != "qkv_bias"}, "params": m.params},
        "gpu": gpu.as_dict() if gpu else None,
        "kv_cache_dtype": kv_dtype,
        "kv_bytes_per_token": {d: kv_bytes_per_token(m, d) for d in KV_BYTES},
        "seq_len": seq_len,
        "max_seq_len": max_seq_len,
        "kv_fraction": kv_fraction,
        "runtime_overhead_bytes": RUNTIME_OVERHEAD if gpu else None,
        "formats": rows,
        "warnings": warnings,
    }


def _format_row(
    m: ModelShape,
    fmt: str,
    gpu: Gpu | None,
    seq_len: int,
    max_seq_len: int,
    kv_fraction: float,
    per_token: int,
    warnings: list[str],
) -> dict:
    """One format's row of the plan: its weights and, with a GPU, whether it runs there, the KV pool left,
    the sequences that fit, the roofline decode speed and the suggested engine limits. A format whose weights
    leave no KV pool adds a warning to `warnings`."""
    row: dict = {
        "format": fmt,
        **weight_bytes(m, fmt),
        "runs_on_gpu": None,
        "kv_pool_bytes": None,
        "fit_sequences": None,
        "fit_sequences_at_max_seq_len": None,
        "tokens_per_s_batch1": None,
        "tokens_per_s_at_fit": None,
        "suggested_max_batch_size": None,
        "suggested_max_num_tokens": None,
    }
    if gpu is None:
        return row
    w = row["weight_bytes"]
    row["runs_on_gpu"] = refusal(fmt, sm=gpu.sm) is None
    pool = int(max(0, gpu.memory_bytes - w - RUNTIME_OVERHEAD) * kv_fraction)
    if pool <= 0:
        warnings.append(f"{fmt}: weights ({w / GB:.1f} GB) leave no room for a KV cache on {gpu.name}")
        return row
    fit = pool // (per_token * _blocks(seq_len))
    batch = min(fit, MAX_BATCH)
    row.update(
        kv_pool_bytes=pool,
        fit_sequences=fit,
        fit_sequences_at_max_seq_len=pool // (per_token * _blocks(max_seq_len)),
        tokens_per_s_batch1=decode_tokens_per_s(1, w, seq_len * per_token, gpu),
        tokens_per_s_at_fit=decode_tokens_per_s(batch, w, seq_len * per_token, gpu),
        suggested_max_batch_size=max(1, pow2_floor(batch)),
        suggested_max_num_tokens=min(
            16384, math.ceil((pow2_floor(batch) + min(seq_len, 8192)) / 1024) * 1024
        ),
    )
    return row


def _num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if Console().is_terminal else 120)
    m, gpu = result["model"], result["gpu"]
    kv = result["kv_bytes_per_token"]
    console.print(
        f"[bold]{m['name']}[/bold]: {m['params'] / 1e9:.2f}B params, {m['layers']} layers, "
        f"{m['heads']} heads / {m['kv_heads']} KV heads x {m['head_dim']}, vocab {m['vocab']:,}"
        f"{', tied embeddings' if m['tied_embeddings'] else ''}"
    )
    console.print("KV cache per token: " + ", ".join(f"{d} {b / 1024:g} KiB" for d, b in kv.items()))
    if gpu:
        console.print(
            f"GPU: {gpu['name']} ({gpu['memory_bytes'] / 1024**3:.1f} GiB, {gpu['bandwidth_tbs']} TB/s, "
            f"sm{gpu['sm']}); {result['kv_cache_dtype']} KV at {result['seq_len']} tokens, "
            f"kv_fraction {result['kv_fraction']}, {result['runtime_overhead_bytes'] / 1024**3:g} GiB runtime overhead assumed"
        )
    table = Table(show_header=True, header_style="bold")
    table.add_column("format", no_wrap=True)
    for col in ("weights GB", "bf16 GB", "scales MB"):
        table.add_column(col, justify="right")
    if gpu:
        for col in (
            "runs",
            f"seqs @{result['seq_len']}",
            "tok/s b=1",
            "tok/s @fit",
            "max_batch",
            "max_tokens",
        ):
            table.add_column(col, justify="right")
    for r in result["formats"]:
        cells = [
            r["format"],
            f"{r['weight_bytes'] / GB:.2f}",
            f"{r['high_precision_bytes'] / GB:.2f}",
            f"{r['scale_bytes'] / 1e6:.1f}",
        ]
        if gpu:
            cells += [
                "yes" if r["runs_on_gpu"] else "[red]no[/red]",
                _num(r["fit_sequences"]),
                _num(r["tokens_per_s_batch1"]),
                _num(r["tokens_per_s_at_fit"]),
                _num(r["suggested_max_batch_size"]),
                _num(r["suggested_max_num_tokens"]),
            ]
        table.add_row(*cells)
    console.print(table)
    if not gpu:
        console.print("add --gpu NAME (e.g. h200, l40s) for fit, decode speed and engine limits")
    for w in result["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}")


def check_fit(
    config: dict, fmt: str, kv_dtype: str, max_seq_len: int, gpus_per_engine: int, gpu: Gpu, where: str
) -> None:
    """Refuse a build whose weights plus one sequence of max_seq_len KV cannot fit on the target GPU."""
    shape = shape_from_config(config, where)
    weights = weight_bytes(shape, fmt)["weight_bytes"] / gpus_per_engine
    kv = kv_bytes_per_token(shape, kv_dtype) * max_seq_len / gpus_per_engine
    need = weights + kv + RUNTIME_OVERHEAD
    if need > gpu.memory_bytes:
        raise UsageError(
            f"{where}: {fmt} weights {weights / GB:.1f} GB + KV for one {max_seq_len}-token sequence {kv / GB:.2f} GB "
            f"+ {RUNTIME_OVERHEAD / GB:.1f} GB runtime per GPU = {need / GB:.1f} GB > {gpu.name} {gpu.memory_bytes / GB:.1f} GB"
            " - use a smaller format, a larger tp_size, or a lower build.max_seq_len"
        )
