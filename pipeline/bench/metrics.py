"""genai-perf's LLM metrics over request timelines (seconds in, milliseconds out for latencies).

Per request (successful, with output):
  TTFT  = first response carrying output - request start
  E2E   = last response carrying output - request start ("request latency")
  OSL   = output tokens the server sent (output_ids), or responses when only text comes back
  ISL   = input tokens: the server's num_input_tokens when it returns it, else counted client-side
          (the prompt's token ids, or the served model's tokenizer); None when neither is known
  ITL   = (E2E - TTFT) / (OSL - 1), only for OSL > 1
  tokens/s per user = 1 / ITL, genai-perf's (and AIPerf's) "Output Token Throughput Per User":
        it excludes TTFT, so it is the decode speed one user sees.
System: output tokens/s = total OSL / wall time of the level; requests/s = successes / wall time;
goodput = requests/s that met every SLO (e.g. ttft <= 200 ms and itl <= 50 ms).
Start is the scheduled time in open loop, so queueing in the client or server counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# parse_slo is re-exported for the callers that read SLOs next to the metrics; its home is pipeline/slo.py
from ..slo import parse_slo  # noqa: F401
from .load import Record, Run

PERCENTILES = (50, 90, 99)


@dataclass
class RequestMetrics:
    ttft_ms: float
    e2e_ms: float
    osl: int
    itl_ms: float | None  # None when OSL == 1


def request_metrics(rec: Record) -> RequestMetrics | None:
    """The metrics of one request; None for a failed one or one that produced no output."""
    if rec.error is not None or not rec.times:
        return None
    ttft = (rec.times[0] - rec.start) * 1e3
    e2e = (rec.times[-1] - rec.start) * 1e3
    osl = int(sum(rec.tokens))
    itl = (e2e - ttft) / (osl - 1) if osl > 1 else None
    return RequestMetrics(ttft, e2e, osl, itl)


def stats(values: list[float]) -> dict[str, float] | None:
    """mean/min/max/p50/p90/p99 (linear interpolation between closest ranks); None when empty."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    out = {"mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max())}
    out.update({f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES})
    return out


def meets(m: RequestMetrics, slo: dict[str, float]) -> bool:
    values = {"ttft": m.ttft_ms, "itl": m.itl_ms, "e2e": m.e2e_ms}
    return all(values[k] is not None and values[k] <= limit for k, limit in slo.items())  # type: ignore[operator]


def summarize(run: Run, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """One level's results: counts, failures (with first errors), latency stats, throughputs, goodput."""
    slo = slo or {}
    per = [(r, request_metrics(r)) for r in run.records]
    ok = [m for _, m in per if m is not None]
    failed = [r for r, m in per if m is None]
    wall = run.wall_s if run.wall_s > 0 else float("nan")
    total_osl = sum(m.osl for m in ok)
    itls = [m.itl_ms for m in ok if m.itl_ms is not None]
    good = sum(1 for m in ok if meets(m, slo)) if slo else None
    done = [r for r, m in per if m is not None]
    measured_in = [float(r.input_tokens) for r in done if r.input_tokens is not None]
    counted_by = sorted({r.input_counted_by for r in done if r.input_counted_by})
    return {
        "load": run.load,
        "requests": len(run.records),
        "succeeded": len(ok),
        "failed": len(failed),
        "errors": sorted({r.error or "no output" for r in failed})[:5],
        "wall_s": run.wall_s,
        "token_source": run.token_source,
        "ttft_ms": stats([m.ttft_ms for m in ok]),
        "itl_ms": stats(itls),
        "e2e_ms": stats([m.e2e_ms for m in ok]),
        "osl": stats([float(m.osl) for m in ok]),
        # requested vs measured lengths of the successful requests (ISL requested: none for dataset prompts)
        "isl_requested": stats([float(r.isl) for r in done if r.isl]),
        "isl": stats(measured_in) if len(measured_in) == len(done) else None,
        "isl_counted_by": counted_by,
        "osl_requested": stats([float(r.osl) for r in done if r.osl]),
        "tokens_per_s_per_user": stats([1e3 / v for v in itls if v > 0]),
        "output_tokens_per_s": total_osl / wall,
        "requests_per_s": len(ok) / wall,
        "slo_ms": slo,
        "good_requests": good,
        "goodput_rps": (good / wall) if good is not None else None,
        "client_cpu_s": run.cpu_s,
        "client_cpu_util": run.cpu_s / wall,  # cores the client kept busy (1.0 = one core)
    }
