"""The metric vocabulary of a served LPX model, for rules, the dashboard and `lpx top`: one set of names for
the engine, llmapi and torch targets.

- Triton's own families (every model): nv_inference_request_success / _failure, nv_inference_*_duration_us,
  nv_inference_request_summary_us (LPX serves with summary latencies on), nv_gpu_* and nv_cpu_*.
- The TensorRT-LLM backend's families on the `tensorrt_llm` model: its C++ backend publishes them on the
  engine target, LPX's python model on torch and llmapi (pipeline/runtime/trtllm_metrics.py; the names,
  labels and kinds are tests/contracts/trtllm_backend_metrics.json).
- The OpenAI gateway's lpx_gateway_* families on its own /metrics (docs/gateway.md), where latency
  histograms per request live: TTFT, inter-token latency, end to end.

Every rule aggregates `by (namespace, pod)`, the labels Prometheus gives a Kubernetes pod's series (a scrape
outside Kubernetes sets them as target labels), like the queue/compute ratio the HPA scales on (its
recording rule, lpx:queue_compute_ratio, is pipeline/deploy/k8s.py's: rules.py takes it from there).
"""

from __future__ import annotations

BY = "namespace, pod"
ENGINE_MODEL = "tensorrt_llm"  # the model every request reaches (ensemble, BLS and the gateway call it)
ENTRY_MODELS = "ensemble|tensorrt_llm_bls"  # where Triton counts a refused request (see ERROR_RATIO)

# The TensorRT-LLM backend's families (label: values in tests/contracts/trtllm_backend_metrics.json)
REQUESTS = "nv_trt_llm_request_metrics"  # request_type: active, max, scheduled, context, waiting
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"  # kv_cache_block_type: max, free, used, tokens_per, ...
BATCHER = "nv_trt_llm_inflight_batcher_metrics"  # inflight_batcher_specific_metric: generation_requests, ...
GENERAL = "nv_trt_llm_general_metrics"  # general_type: iteration_counter, timestamp
MEMORY = "nv_trt_llm_runtime_memory_metrics"  # memory_type: cpu, gpu, pinned
OUTPUT_TOKENS = "nv_llm_output_token_len"  # histogram per finished request
INPUT_TOKENS = "nv_llm_input_token_len"

# Triton's families
SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
REQUEST_DURATION = "nv_inference_request_duration_us"
REQUEST_SUMMARY = "nv_inference_request_summary_us"
GPU_UTILIZATION = "nv_gpu_utilization"  # 0..1 per gpu_uuid
GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
GPU_POWER = "nv_gpu_power_usage"  # watts
GPU_POWER_LIMIT = "nv_gpu_power_limit"
CPU_UTILIZATION = "nv_cpu_utilization"
CPU_MEMORY_USED = "nv_cpu_memory_used_bytes"

# The gateway's families (pipeline/gateway/metrics.py on the gateway's branch; docs/gateway.md)
GATEWAY_REQUESTS = "lpx_gateway_requests_total"  # route, status
GATEWAY_TTFT = "lpx_gateway_time_to_first_token_seconds"  # histograms, route
GATEWAY_ITL = "lpx_gateway_inter_token_latency_seconds"
GATEWAY_E2E = "lpx_gateway_e2e_request_latency_seconds"
GATEWAY_PROMPT_TOKENS = "lpx_gateway_prompt_tokens_total"
GATEWAY_COMPLETION_TOKENS = "lpx_gateway_completion_tokens_total"
GATEWAY_IN_FLIGHT = "lpx_gateway_requests_in_flight"

# Recorded series (rules.py writes them; the dashboard and the alerts read them)
REQUEST_RATE = "lpx:request_rate:1m"
ERROR_RATIO = "lpx:request_error_ratio:5m"
WAITING = "lpx:requests_waiting"
SCHEDULED = "lpx:requests_scheduled"
KV_USED = "lpx:kv_cache_used:ratio"
OUTPUT_TOKEN_RATE = "lpx:output_tokens:rate1m"
INPUT_TOKEN_RATE = "lpx:input_tokens:rate1m"
TTFT_P99 = "lpx:ttft_seconds:p99_5m"
GPU_MEMORY_RATIO = "lpx:gpu_memory_used:ratio"


def label(family: str, key: str, value: str) -> str:
    """One series of a backend family, e.g. label(REQUESTS, 'request_type', 'waiting')."""
    return f'{family}{{{key}="{value}"}}'


def by_pod(expr: str) -> str:
    return f"sum by ({BY}) ({expr})"


_FAILED = by_pod(f'rate({FAILURE}{{model=~"{ENTRY_MODELS}|{ENGINE_MODEL}"}}[5m])')
_REACHED = by_pod(f'rate({SUCCESS}{{model="{ENGINE_MODEL}"}}[5m])')
RECORDS: dict[str, str] = {
    REQUEST_RATE: by_pod(f'rate({SUCCESS}{{model="{ENGINE_MODEL}"}}[1m])'),
    # Refused requests over all requests. Triton counts a refusal on the model that refused it: the ensemble
    # or BLS (their validation), the engine target's C++ tensorrt_llm; a python model's error response is a
    # success for Triton, and Triton 2.51 counts a refused ensemble request twice (docs/monitoring.md)
    ERROR_RATIO: f"{_FAILED} / ({_REACHED} + {_FAILED})",
    WAITING: by_pod(label(REQUESTS, "request_type", "waiting")),
    SCHEDULED: by_pod(label(REQUESTS, "request_type", "scheduled")),
    KV_USED: f"{by_pod(label(KV_BLOCKS, 'kv_cache_block_type', 'used'))} / "
    f"clamp_min({by_pod(label(KV_BLOCKS, 'kv_cache_block_type', 'max'))}, 1)",
    OUTPUT_TOKEN_RATE: by_pod(f"rate({OUTPUT_TOKENS}_sum[1m])"),
    INPUT_TOKEN_RATE: by_pod(f"rate({INPUT_TOKENS}_sum[1m])"),
    TTFT_P99: f"histogram_quantile(0.99, sum by ({BY}, le) (rate({GATEWAY_TTFT}_bucket[5m])))",
    GPU_MEMORY_RATIO: f"max by ({BY}) ({GPU_MEMORY_USED} / {GPU_MEMORY_TOTAL})",
}
