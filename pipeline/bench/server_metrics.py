"""What a bench reads off a server's /metrics (one parser for all: pipeline/monitoring/scrape.py's): Triton's
per-model counters (scripts/bench_repo.py's postprocessing cost per token) and vLLM's own histograms
(scripts/bench_vllm.py --trace: its front end's TTFT, queue and prefill times), each read before and after
a batch of requests and subtracted.
"""

from __future__ import annotations

import math

from ..monitoring.scrape import Scrape, scrape

# Triton's per-model counters (microseconds, or counts), summed over the model's versions
TRITON_COUNTERS = (
    "nv_inference_compute_infer_duration_us",
    "nv_inference_request_duration_us",
    "nv_inference_request_success",
    "nv_inference_exec_count",
    "nv_inference_count",
)
# vLLM's histograms (seconds) of what its API server and engine core saw of each request
VLLM_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}


def model_counters(read: Scrape, model: str) -> dict[str, float]:
    """TRITON_COUNTERS of `model` in one read (0 for a counter the server does not report)."""
    return {name: read.total(name, model=model) or 0.0 for name in TRITON_COUNTERS}


def triton_model_counters(url: str, model: str, timeout_s: float = 10.0) -> dict[str, float]:
    """Read Triton's metrics port (HOST:PORT) now: TRITON_COUNTERS of `model`."""
    return model_counters(scrape(url, timeout_s), model)


def histogram_totals(read: Scrape, names: dict[str, str] = VLLM_HISTOGRAMS) -> dict[str, tuple[float, float]]:
    """key -> (sum, count) of each histogram in `names` (key -> family), summed over its labels."""
    return {
        key: (read.total(f"{name}_sum") or 0.0, read.total(f"{name}_count") or 0.0)
        for key, name in names.items()
    }


def vllm_histograms(url: str, timeout_s: float = 30.0) -> dict[str, tuple[float, float]]:
    """Read vLLM's /metrics (its OpenAI server's URL) now: VLLM_HISTOGRAMS' (sum, count)."""
    return histogram_totals(scrape(url, timeout_s))


def mean_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """key -> the mean, in milliseconds, of the observations each histogram got between two reads (NaN
    for one that got none)."""
    out = {}
    for key in after:
        count = after[key][1] - before[key][1]
        out[key] = (after[key][0] - before[key][0]) / count * 1000 if count else math.nan
    return out
