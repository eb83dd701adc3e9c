"""The Triton TensorRT-LLM backend's metric families, published by LPX's own `tensorrt_llm` python model
(torch and llmapi targets), so that a dashboard, rule or query written once works on every target.

The families, label values and kinds are the backend's (tests/contracts/trtllm_backend_metrics.json has
the source files and commits). What its C++ model does (inflight_batcher_llm/src/model_instance_state.cc
and custom_metrics_reporter/custom_metrics_reporter.cc), done here with Triton's python custom metrics (pb_utils.MetricFamily):

- every `stats_check_period_ms` (the backend's parameter, default 100) the engine's latest TensorRT-LLM
  `IterationStats` (the executor's JSON spelling: numActiveRequests, kvCacheStats.usedNumBlocks, ...)
  become the backend's keys (`backend_stats`, as its WaitForStats does) and each key sets one gauge;
- per finished request, its prompt and generated token counts are observed in nv_llm_input_token_len /
  nv_llm_output_token_len (buckets 10, 50, 100, 500, 1000), as its reportCustomMetrics does.

Engines provide `iteration_stats()`: the torch engine reads transformers' scheduler and paged cache
(engines/torch_stats.py), the llmapi engine asks TensorRT-LLM (LLM.get_stats). LPX serves no
disaggregated prefill/decode, so nv_trt_llm_disaggregated_serving_metrics stays 0, as on the backend.
Runs inside Triton's python stub: `triton_python_backend_utils` is imported when a reporter is made.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

STATS_CHECK_PERIOD_MS = 100  # the backend's default for its stats_check_period_ms parameter
TOKEN_BUCKETS = (10.0, 50.0, 100.0, 500.0, 1000.0)
TIMESTAMP_FORMAT = "%m-%d-%Y %H:%M:%S.%f"  # IterationStats.timestamp (local time), as the executor writes it

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"
# (family, help, kind, category label, ((label value, the backend's statistics key), ...)), in the
# backend's order (custom_metrics_reporter.cc: InitializeReporter for an inflight-batching model)
FAMILIES: tuple[tuple[str, str, str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "nv_trt_llm_request_metrics",
        "TRT LLM request metrics",
        GAUGE,
        "request_type",
        (
            ("active", "Active Request Count"),
            ("max", "Max Request Count"),
            ("scheduled", "Scheduled Requests"),
            ("context", "Context Requests"),
            ("waiting", "Waiting Requests"),
        ),
    ),
    (
        "nv_trt_llm_runtime_memory_metrics",
        "TRT LLM runtime memory metrics",
        GAUGE,
        "memory_type",
        (
            ("cpu", "Runtime CPU Memory Usage"),
            ("gpu", "Runtime GPU Memory Usage"),
            ("pinned", "Runtime Pinned Memory Usage"),
        ),
    ),
    (
        "nv_trt_llm_kv_cache_block_metrics",
        "TRT LLM KV cache block metrics",
        GAUGE,
        "kv_cache_block_type",
        (
            ("max", "Max KV cache blocks"),
            ("free", "Free KV cache blocks"),
            ("used", "Used KV cache blocks"),
            ("tokens_per", "Tokens per KV cache block"),
            ("reused", "Reused KV cache blocks"),
            ("fraction", "Fraction used KV cache blocks"),
        ),
    ),
    (
        "nv_trt_llm_disaggregated_serving_metrics",
        "TRT LLM disaggregated serving metrics",
        COUNTER,
        "disaggregated_serving_type",
        (("kv_cache_transfer_ms", "KV cache transfer time"), ("request_count", "Request count")),
    ),
    (
        "nv_trt_llm_inflight_batcher_metrics",
        "TRT LLM inflight_batcher-specific metrics",
        GAUGE,
        "inflight_batcher_specific_metric",
        (
            ("total_context_tokens", "Total Context Tokens"),
            ("generation_requests", "Generation Requests"),
            ("micro_batch_id", "MicroBatch ID"),
            ("paused_requests", "Paused Requests"),
        ),
    ),
    (
        "nv_trt_llm_general_metrics",
        "General TRT LLM metrics",
        GAUGE,
        "general_type",
        (("timestamp", "Timestamp"), ("iteration_counter", "Iteration Counter")),
    ),
    (
        "nv_llm_output_token_len",
        "TRT LLM response metrics",
        HISTOGRAM,
        "response_metric_type",
        (("total_output_tokens", "Total Output Tokens"),),
    ),
    (
        "nv_llm_input_token_len",
        "TRT LLM response metrics",
        HISTOGRAM,
        "response_metric_type",
        (("total_input_tokens", "Total Input Tokens"),),
    ),
)


def timestamp_us(stamp: Any) -> float:
    """IterationStats.timestamp ("%m-%d-%Y %H:%M:%S.%f", local time) as microseconds since the epoch, as
    the backend publishes it; now when it is missing or spelled otherwise."""
    try:
        return datetime.strptime(str(stamp), TIMESTAMP_FORMAT).timestamp() * 1e6
    except ValueError:
        return time.time() * 1e6


def backend_stats(it: dict[str, Any]) -> dict[str, float]:
    """One IterationStats dict -> the backend's statistics keys and values (model_instance_state.cc,
    WaitForStats): request counts, memory, the timestamp; with inflightBatchingStats the batch (and
    'Waiting Requests' = active - scheduled); with kvCacheStats the blocks and the used fraction."""
    active = float(it.get("numActiveRequests") or 0)
    out = {
        "Active Request Count": active,
        "Iteration Counter": float(it.get("iter") or 0),
        "Max Request Count": float(it.get("maxNumActiveRequests") or 0),
        "Runtime CPU Memory Usage": float(it.get("cpuMemUsage") or 0),
        "Runtime GPU Memory Usage": float(it.get("gpuMemUsage") or 0),
        "Runtime Pinned Memory Usage": float(it.get("pinnedMemUsage") or 0),
        "Timestamp": timestamp_us(it.get("timestamp")),
    }
    ifb = it.get("inflightBatchingStats")
    if ifb:
        scheduled = float(ifb.get("numScheduledRequests") or 0)
        out.update(
            {
                "Context Requests": float(ifb.get("numContextRequests") or 0),
                "Generation Requests": float(ifb.get("numGenRequests") or 0),
                "MicroBatch ID": float(ifb.get("microBatchId") or 0),
                "Paused Requests": float(ifb.get("numPausedRequests") or 0),
                "Scheduled Requests": scheduled,
                "Total Context Tokens": float(ifb.get("numCtxTokens") or 0),
                "Waiting Requests": active - scheduled,
            }
        )
    kv = it.get("kvCacheStats")
    if kv:
        blocks, used = float(kv.get("maxNumBlocks") or 0), float(kv.get("usedNumBlocks") or 0)
        out.update(
            {
                "Free KV cache blocks": float(kv.get("freeNumBlocks") or 0),
                "Max KV cache blocks": blocks,
                "Tokens per KV cache block": float(kv.get("tokensPerBlock") or 0),
                "Used KV cache blocks": used,
                "Reused KV cache blocks": float(kv.get("reusedBlocks") or 0),
                "Fraction used KV cache blocks": used / blocks if blocks > 0 else 0.0,
            }
        )
    return out


class MetricsReporter:
    """The backend's families on Triton's /metrics, labelled model and version as the backend's, fed from
    `stats()` (an engine's iteration_stats: an IterationStats dict, or None while it has none) by a
    daemon thread every `period_s`, and from `observe_request` per finished request."""

    def __init__(
        self,
        stats: Callable[[], dict[str, Any] | None],
        model: str,
        version: str,
        period_s: float = STATS_CHECK_PERIOD_MS / 1000,
        pb: Any = None,
    ) -> None:
        if pb is None:
            import triton_python_backend_utils as pb
        kinds = {
            GAUGE: pb.MetricFamily.GAUGE,
            COUNTER: pb.MetricFamily.COUNTER,
            HISTOGRAM: pb.MetricFamily.HISTOGRAM,
        }
        self._stats, self._period = stats, max(float(period_s), 0.01)
        self._families: list[Any] = []
        self._metrics: dict[str, Any] = {}  # the backend's key -> its metric
        self._gauges: set[str] = set()
        self._last: dict[str, float] = {}
        for name, help_text, kind, label, values in FAMILIES:
            family = pb.MetricFamily(name=name, description=help_text, kind=kinds[kind])
            self._families.append(family)
            for value, key in values:
                labels = {"model": model, "version": str(version), label: value}
                extra = {"buckets": list(TOKEN_BUCKETS)} if kind == HISTOGRAM else {}
                self._metrics[key] = family.Metric(labels=labels, **extra)
                if kind == GAUGE:
                    self._gauges.add(key)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name="lpx-trtllm-metrics", daemon=True)
        self._thread.start()

    def update(self) -> None:
        """Set every gauge from the engine's latest iteration (only the values that changed)."""
        it = self._stats()
        if not it:
            return
        values = backend_stats(it)
        with self._lock:
            for key, value in values.items():
                if key in self._gauges and self._last.get(key) != value:
                    self._metrics[key].set(value)
                    self._last[key] = value

    def observe_request(self, input_tokens: int, output_tokens: int) -> None:
        """One finished request: its prompt tokens and the tokens the engine generated."""
        with self._lock:
            self._metrics["Total Input Tokens"].observe(float(input_tokens))
            self._metrics["Total Output Tokens"].observe(float(output_tokens))

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.update()
            except Exception as exc:  # metrics must never stop serving; say it once in Triton's log
                if not self._warned:
                    self._warned = True
                    print(f"lpx: tensorrt_llm metrics not updated: {exc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop updating; drop the metrics before their families (the python backend's rule)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            self._metrics.clear()
            self._families.clear()
