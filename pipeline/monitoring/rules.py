"""LPX's Prometheus rules as data: the recorded series of promql.py and the alerts on them, with their
thresholds. `lpx monitoring` writes them as a rule file (promtool checks and unit-tests it) and as a
PrometheusRule for the Prometheus Operator; docs/monitoring.md has the table.

Three groups: `lpx.autoscaling` records the queue/compute ratio the HPA scales on (the expression lpx
deploy's PrometheusRule records too: `lpx monitoring --no-autoscaling-rule` leaves it out where that one
is applied), `lpx.serving` the other recorded
series, `lpx.alerts` the alerts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..deploy.k8s import QUEUE_RATIO, QUEUE_RATIO_EXPR
from . import promql as q

DOCS = "docs/monitoring.md"


@dataclass(frozen=True)
class Thresholds:
    """When the alerts fire (each for its `for` duration, below)."""

    error_ratio: float = 0.05  # refused / all requests over 5 minutes
    ttft_p99_s: float = 2.0  # the TTFT SLO: p99 over 5 minutes, from the gateway's histogram
    queue_ratio: float = 2.0  # queue time / compute time, and still rising (twice the HPA's default target)
    kv_cache_used: float = 0.9  # used / all KV-cache blocks
    gpu_memory_used: float = 0.95  # used / total memory of the fullest GPU of a pod


def _alert(name: str, expr: str, wait: str, severity: str, summary: str, fix: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": wait,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": f"{fix} ({DOCS}, Rules)",
        },
    }


def alerts(t: Thresholds) -> list[dict[str, Any]]:
    pod = "{{ $labels.namespace }}/{{ $labels.pod }}"
    return [
        _alert(
            "LpxHighErrorRate",
            f"{q.ERROR_RATIO} > {t.error_ratio:g}",
            "5m",
            "critical",
            f"{pod}: {{{{ $value | humanizePercentage }}}} of requests are refused (above {t.error_ratio:.0%})",
            "Read the Triton log of the pod: refusals name the bad value; engine errors name the fix",
        ),
        _alert(
            "LpxTTFTAboveSLO",
            f"{q.TTFT_P99} > {t.ttft_p99_s:g}",
            "10m",
            "warning",
            f"{pod}: TTFT p99 is {{{{ $value | humanizeDuration }}}}, above the {t.ttft_p99_s:g}s SLO",
            "Add replicas (the HPA's max_replicas), lower max_batch_size or max_num_tokens, or a faster engine",
        ),
        _alert(
            "LpxQueueTimeRising",
            f"{QUEUE_RATIO} > {t.queue_ratio:g} and deriv({QUEUE_RATIO}[10m]) > 0",
            "10m",
            "warning",
            f"{pod}: requests wait {{{{ $value | humanize }}}}x longer than they compute, and it keeps growing",
            "The HPA is at max_replicas or cannot place pods (no free GPU): raise the limit or add GPUs",
        ),
        _alert(
            "LpxKVCacheNearlyFull",
            f"{q.KV_USED} > {t.kv_cache_used:g}",
            "5m",
            "warning",
            f"{pod}: {{{{ $value | humanizePercentage }}}} of the KV-cache blocks are in use",
            "New requests wait for blocks: add replicas, shorten max_tokens, or give the KV cache more memory",
        ),
        _alert(
            "LpxGPUMemoryHigh",
            f"{q.GPU_MEMORY_RATIO} > {t.gpu_memory_used:g}",
            "10m",
            "warning",
            f"{pod}: a GPU's memory is {{{{ $value | humanizePercentage }}}} used",
            "Leave headroom: lower the KV-cache memory fraction or max_batch_size, or use a larger GPU",
        ),
    ]


def rule_groups(t: Thresholds | None = None, autoscaling: bool = True) -> list[dict[str, Any]]:
    """The rule groups, as Prometheus's rule file (and a PrometheusRule's spec) spells them; without
    `autoscaling` the queue/compute ratio is left to lpx deploy's PrometheusRule, which records it too."""
    t = t or Thresholds()
    groups = [
        {"name": "lpx.autoscaling", "rules": [{"record": QUEUE_RATIO, "expr": QUEUE_RATIO_EXPR}]},
        {"name": "lpx.serving", "rules": [{"record": n, "expr": e} for n, e in q.RECORDS.items()]},
        {"name": "lpx.alerts", "rules": alerts(t)},
    ]
    return groups if autoscaling else groups[1:]
