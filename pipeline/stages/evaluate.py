"""The eval stage: quality of a quantized variant against the unquantized model, on held-out text, and the
quality gate that decides whether the variant is built. Owns its key (`inputs`), run and gate.

Per next-token position: KL(p_base || p_quant), whether the argmax tokens agree, and the
negative log-likelihood of the true next token under each model (-> perplexity).
"""

from __future__ import annotations

import math
from pathlib import Path

from .. import toolchain
from ..artifacts import Artifact
from ..cache_keys import code_fingerprint
from ..config import QualityGate, Variant
from ..errors import UsageError
from ..facts.formats import refusal
from .context import Context
from .quantize.model_io import STATE_FILE, device, load_model, load_tokenizer, restore

CODE = (
    "pipeline.stages.evaluate",
    "pipeline.stages.quantize.model_io",
    "pipeline.runtime.restore",
    "pipeline.texts",
)


def inputs(ctx: Context, variant: Variant, checkpoint: Artifact) -> dict:
    """The key's inputs: the source checkpoint, the quantize artifact's key, the held-out samples, the
    toolchain that runs both models and this stage's code."""
    _, fingerprint = ctx.checkpoint()
    texts = ctx.texts("evaluation")
    return {
        "checkpoint": fingerprint,
        "checkpoint_key": checkpoint.key,
        "evaluation": {
            **ctx.cfg.evaluation.model_dump(mode="json", exclude={"data"}),
            "data_sha256": texts.sha256,
        },
        "versions": toolchain.versions("torch", "transformers", "modelopt"),
        "code": code_fingerprint(CODE),
    }


def run(ctx: Context, variant: Variant, checkpoint: Artifact, out: Path) -> dict:
    """Measure the variant against the unquantized model (nothing is written to `out`)."""
    import torch

    cfg, report = ctx.cfg, ctx.report
    info, _ = ctx.checkpoint()
    texts = ctx.texts("evaluation")
    checkpoint = checkpoint.path

    # the quality check runs ModelOpt's fake-quant forward, as the torch target does
    why = refusal(variant.quantization.format, target="torch", gpu=device() == "cuda")
    if why:
        return {"skipped": f"{why}; run 'lpx eval' on a GPU machine"}
    if not (checkpoint / "state" / STATE_FILE).is_file():
        return {
            "skipped": "the quantize artifact has no state/ export (build.target does not need it and every "
            "quality_gate limit is null) - set a limit or add 'state' to quantization.exports"
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
        raise UsageError("evaluation: the held-out samples are too short (fewer than 2 tokens each)")
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


LIMITS = (  # (result, limit's name, True when the result must stay at or below the limit, unit)
    ("kl_mean", "max_kl", True, ""),
    ("top1_agreement", "min_top1_agreement", False, ""),
    ("ppl_increase_pct", "max_ppl_increase_pct", True, "%"),
)


def gate_failures(results: dict, gate: QualityGate) -> list[str]:
    """Each limit the measured results break: the figure, the limit (and whether it is the default), and
    by how much. A variant that could not be evaluated fails only a gate the config sets itself."""
    if "skipped" in results:
        return [f"not evaluated ({results['skipped']})"] if gate.explicit() else []
    out = []
    for name, key, at_most, unit in LIMITS:
        limit = getattr(gate, key)
        if limit is None or name not in results:
            continue
        value = results[name]
        if (value > limit) if at_most else (value < limit):
            origin = "set in quality_gate" if key in gate.model_fields_set else "default"
            side = "above" if at_most else "below"
            out.append(
                f"{name} {value:.4g}{unit} is {abs(value - limit):.3g}{unit} {side} the limit "
                f"quality_gate.{key} {limit:g}{unit} ({origin})"
            )
    return out


def gate_summary(gate: QualityGate) -> str:
    """The limits in force, one line: what `lpx eval`'s table is judged against."""
    parts = [
        f"{name} {'<=' if at_most else '>='} {getattr(gate, key):g}{unit} "
        f"({'set' if key in gate.model_fields_set else 'default'})"
        for name, key, at_most, unit in LIMITS
        if getattr(gate, key) is not None
    ]
    return "gate: " + (", ".join(parts) if parts else "off (every quality_gate limit is null)")


def gate_warnings(results: dict, gate: QualityGate) -> list[str]:
    """What the default gate could not check (a variant not evaluated here), to say rather than fail."""
    if "skipped" in results and gate.active() and not gate.explicit():
        return [f"not evaluated, the default quality gate did not apply ({results['skipped']})"]
    return []
