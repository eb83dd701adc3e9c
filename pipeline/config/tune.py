"""lpx.yaml's `tune` section: the search `lpx tune` runs over the config's variants x a grid of build
limits (docs/tune.md). Command-line options override these values."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from ..slo import message, slo_problem
from .base import COUNT, INT32, INT32_MAX, Strict, bounded

Limit = Annotated[int, Field(ge=1, le=INT32_MAX)]  # a build limit, int32 as build.max_batch_size
MAX_CONCURRENCY = 16384


class TuneGrid(Strict):
    """Build limits to try per variant; unset: around what `lpx plan` says fits the GPU (build.gpu or the
    GPU present), or half and all of the build section's value without a GPU."""

    max_batch_size: list[Limit] | None = Field(None, description="e.g. [64, 128, 256].")
    max_num_tokens: list[Limit] | None = Field(None, description="e.g. [4096, 8192].")

    @field_validator("max_batch_size", "max_num_tokens")
    @classmethod
    def _values(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if not v or min(v) < 1:
                raise ValueError("must list one or more values >= 1")
            if len(set(v)) != len(v):
                raise ValueError("lists a value twice")
        return v


class Tune(Strict):
    slo: str | None = Field(
        None,
        description="The latency SLO each request must meet, e.g. 'ttft=200ms,itl=30ms' (keys ttft, itl, e2e).",
    )
    grid: TuneGrid = Field(default_factory=TuneGrid)
    input_len: int = bounded(128, ge=1, le=INT32_MAX, limit=INT32, description="Prompt tokens per request.")
    output_len: int = bounded(128, ge=1, le=INT32_MAX, limit=INT32, description="Output tokens per request.")
    requests_per_level: int = bounded(
        32, ge=4, le=INT32_MAX, limit=COUNT, description="Counted requests at each load level."
    )
    warmup: int = bounded(
        4, ge=0, le=INT32_MAX, limit=COUNT, description="Uncounted requests before each level."
    )
    attainment: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of a level's requests that must meet the SLO for the level to pass.",
    )
    max_concurrency: int = bounded(
        256,
        ge=1,
        le=MAX_CONCURRENCY,
        limit="each concurrent request is an open stream of one client process",
        description="Highest closed-loop concurrency tried.",
    )
    rate_steps: int = bounded(
        4,
        ge=0,
        le=32,
        limit="each step is one more measured load level",
        description="Poisson-rate bisection steps around the concurrency knee (0: closed loop only).",
    )

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: str | None) -> str | None:
        if v is not None and (why := slo_problem(v, required=True)):
            raise ValueError(message(v, why))
        return v
