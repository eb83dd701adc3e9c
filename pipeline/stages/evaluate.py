"""Quality of a quantized variant against the unquantized model, on held-out text.

Per next-token position: KL(p_base || p_quant), whether the argmax tokens agree, and the
negative log-likelihood of the true next token under each model (-> perplexity).
"""

from __future__ import annotations

import math
from pathlib import Path

from ..config import Config, QualityGate, Variant
from ..errors import PipelineError
from ..inspection.checkpoint import CheckpointInfo
from ..progress import Reporter
from .quantize import STATE_FILE, device, load_model, load_tokenizer, restore
from .quantize.calibration import CalibrationSet

CUDA_ONLY = ("nvfp4",)  # ModelOpt's NVFP4 fake-quant kernels need CUDA (calibration and export do not)
METRICS = ("kl_mean", "top1_agreement", "ppl_baseline", "ppl_quantized", "ppl_increase_pct")


def run(
    cfg: Config,
    variant: Variant,
    info: CheckpointInfo,
    checkpoint: Path,
    texts: CalibrationSet,
    report: Reporter,
) -> dict:
    import torch

    if variant.quantization.format in CUDA_ONLY and device() != "cuda":
        return {
            "skipped": f"format '{variant.quantization.format}' is simulated by ModelOpt on CUDA only; "
            "run 'lpx eval' on a GPU machine"
        }
    if not (checkpoint / "state" / STATE_FILE).is_file():
        return {
            "skipped": "the quantize artifact has no state/ export (build.target does not need it and no "
            "quality_gate is set) - set a quality_gate or add 'state' to quantization.exports"
        }
    tokenizer = load_tokenizer(cfg)
    base = load_model(cfg, info)
    quant, _ = restore(checkpoint / "state", cfg.build.dtype)
    kl = agree = nll_b = nll_q = 0.0
    tokens = 0
    with torch.no_grad(), report.task(f"evaluating {variant.name}", total=len(texts.texts)) as advance:
        for text in texts.texts:
            ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=cfg.evaluation.seq_len)[
                "input_ids"
            ].to(device())
            if ids.shape[1] < 2:
                advance()
                continue
            lb = torch.log_softmax(base(input_ids=ids).logits[0, :-1].float(), dim=-1)
            lq = torch.log_softmax(quant(input_ids=ids).logits[0, :-1].float(), dim=-1)
            target = ids[0, 1:].unsqueeze(-1)
            kl += (lb.exp() * (lb - lq)).sum().item()
            agree += (lb.argmax(-1) == lq.argmax(-1)).sum().item()
            nll_b -= lb.gather(-1, target).sum().item()
            nll_q -= lq.gather(-1, target).sum().item()
            tokens += target.shape[0]
            advance()
    if tokens == 0:
        raise PipelineError("evaluation: the held-out samples are too short (fewer than 2 tokens each)", 2)
    ppl_b, ppl_q = math.exp(nll_b / tokens), math.exp(nll_q / tokens)
    return {
        "kl_mean": kl / tokens,
        "top1_agreement": agree / tokens,
        "ppl_baseline": ppl_b,
        "ppl_quantized": ppl_q,
        "ppl_increase_pct": 100.0 * (ppl_q / ppl_b - 1.0),
        "tokens": tokens,
        "samples": len(texts.texts),
        "data": {"source": texts.source, "sha256": texts.sha256},
    }


def gate_failures(results: dict, gate: QualityGate) -> list[str]:
    """Each limit the measured results break, as 'measured vs allowed'."""
    if "skipped" in results:
        configured = any(v is not None for v in gate.model_dump().values())
        return [f"not evaluated ({results['skipped']})"] if configured else []
    checks = [
        ("kl_mean", gate.max_kl, lambda v, lim: v > lim, "quality_gate.max_kl"),
        (
            "top1_agreement",
            gate.min_top1_agreement,
            lambda v, lim: v < lim,
            "quality_gate.min_top1_agreement",
        ),
        (
            "ppl_increase_pct",
            gate.max_ppl_increase_pct,
            lambda v, lim: v > lim,
            "quality_gate.max_ppl_increase_pct",
        ),
    ]
    return [
        f"{name} {results[name]:.4g} (allowed: {key} {limit:g})"
        for name, limit, bad, key in checks
        if limit is not None and bad(results[name], limit)
    ]
