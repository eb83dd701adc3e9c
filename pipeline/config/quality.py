"""The sections on text and quality: `calibration` and `evaluation` (where their text samples come from,
pipeline/texts.py) and `quality_gate` (the limits a quantized variant must meet against the unquantized
model; docs/quality.md says where the defaults come from)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import COUNT, INT32, INT32_MAX, ConfigPath, Strict, bounded


class TextSamples(Strict):
    """Where a stage's text samples come from (pipeline/texts.py)."""

    data: ConfigPath | None = Field(
        None,
        description="A .txt (one sample per paragraph) or .jsonl file; LPX's own text "
        "(calibration or held-out) if unset.",
    )
    jsonl_field: str = "text"
    samples: int = bounded(32, ge=1, le=INT32_MAX, limit=COUNT)
    seq_len: int = bounded(256, ge=8, le=INT32_MAX, limit=INT32)


CALIBRATION_DTYPES = ("auto", "bfloat16", "float16", "float32")


class Calibration(TextSamples):
    batch_size: int = bounded(1, ge=1, le=INT32_MAX, limit=COUNT)
    dtype: Literal[CALIBRATION_DTYPES] = Field(  # type: ignore[valid-type]
        "auto",
        description="Precision the model is calibrated in (the exports are written in build.dtype): auto is "
        "build.dtype on a GPU and float32 on a CPU, where bfloat16 matrix products without bf16 units run "
        "2-3x slower (docs/quality.md).",
    )


class Evaluation(TextSamples):
    samples: int = bounded(10, ge=1, le=INT32_MAX, limit=COUNT)


# The gate's defaults (docs/quality.md says where they come from): what a user would not ship.
GATE_DEFAULTS = {"max_kl": 0.1, "min_top1_agreement": 0.8, "max_ppl_increase_pct": 10.0}


class QualityGate(Strict):
    """Limits a quantized variant must meet against the unquantized model before it is built. Each has a
    default (GATE_DEFAULTS); null turns that limit off."""

    max_kl: float | None = Field(
        GATE_DEFAULTS["max_kl"],
        ge=0,
        description="Largest mean KL divergence of next-token distributions (null: no limit).",
    )
    min_top1_agreement: float | None = Field(
        GATE_DEFAULTS["min_top1_agreement"],
        ge=0,
        le=1,
        description="Smallest share of equal argmax tokens (null: no limit).",
    )
    max_ppl_increase_pct: float | None = Field(
        GATE_DEFAULTS["max_ppl_increase_pct"],
        ge=0,
        description="Largest perplexity increase, percent (null: no limit).",
    )

    def explicit(self) -> bool:
        """Whether the config itself sets a limit (not only the defaults): then a variant that cannot be
        evaluated fails the gate instead of passing with a warning."""
        return any(getattr(self, name) is not None for name in self.model_fields_set)

    def active(self) -> bool:
        """Whether any limit applies (a config that sets all three to null has no gate)."""
        return any(v is not None for v in self.model_dump().values())
