"""Prometheus metrics of the gateway, on its own CollectorRegistry (served at /metrics), and the JSON
access log: one line per request.

Metric names (all prefixed `lpx_gateway_`):
  requests_total{route,status}             counter  every answered request, by route and HTTP status
  time_to_first_token_seconds{route}       histogram  request arrival -> first token's text sent
  inter_token_latency_seconds{route}       histogram  per request: (last token - first token) / (tokens - 1)
  e2e_request_latency_seconds{route}       histogram  request arrival -> last byte of the answer
  prompt_tokens_total / completion_tokens_total{route}  counters
  requests_in_flight                       gauge  requests being generated now
  connections_refused_total{reason}        counter  connections closed before a request was read, or
                                           mid-body: headers_too_large (431), header_timeout (408),
                                           body_timeout (408), idle (no byte within header_timeout_s)
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "lpx_gateway_requests", "Requests answered, by route and status", ["route", "status"], registry=r
        )
        self.ttft = Histogram(
            "lpx_gateway_time_to_first_token_seconds",
            "Arrival to first token sent",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "lpx_gateway_inter_token_latency_seconds",
            "Per request: (last token - first token) / (tokens - 1)",
            ["route"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "lpx_gateway_e2e_request_latency_seconds",
            "Arrival to the answer's end",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("lpx_gateway_prompt_tokens", "Prompt tokens", ["route"], registry=r)
        self.completion_tokens = Counter(
            "lpx_gateway_completion_tokens", "Completion tokens", ["route"], registry=r
        )
        self.in_flight = Gauge("lpx_gateway_requests_in_flight", "Requests being generated now", registry=r)
        self.refused = Counter(
            "lpx_gateway_connections_refused",
            "Connections closed by the transport's limits, by reason",
            ["reason"],
            registry=r,
        )

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def observe(self, rec: dict[str, Any]) -> None:
        """Record one finished generation request (the access-log record)."""
        route = rec["route"]
        if rec.get("ttft_ms") is not None:
            self.ttft.labels(route).observe(rec["ttft_ms"] / 1e3)
        if rec.get("itl_ms") is not None:
            self.itl.labels(route).observe(rec["itl_ms"] / 1e3)
        self.e2e.labels(route).observe(rec["latency_ms"] / 1e3)
        if rec.get("prompt_tokens"):
            self.prompt_tokens.labels(route).inc(rec["prompt_tokens"])
        if rec.get("completion_tokens"):
            self.completion_tokens.labels(route).inc(rec["completion_tokens"])


ACCESS_FIELDS = (
    "time",
    "request_id",
    "key_id",
    "route",
    "status",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "ttft_ms",
    "latency_ms",
    "stream",
)


class AccessLog:
    """One JSON line per request (ACCESS_FIELDS, plus `error` for a refused request and `prompt` when
    serving.openai.log_prompts is on) to a file, appended, or to stdout for '-'."""

    def __init__(self, path: Path | str | None, log_prompts: bool = False) -> None:
        self.log_prompts = log_prompts
        self._lock = threading.Lock()
        self._out: TextIO | None
        if path in (None, ""):
            self._out = None
        elif str(path) == "-":
            self._out = sys.stdout
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._out = open(path, "a", encoding="utf-8", buffering=1)
        self.path = path

    def write(self, rec: dict[str, Any]) -> None:
        if self._out is None:
            return
        line = {k: rec.get(k) for k in ACCESS_FIELDS}
        line["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(rec["time"])) + (
            f".{int(rec['time'] % 1 * 1000):03d}Z"
        )
        if rec.get("error"):
            line["error"] = rec["error"]
        if self.log_prompts and rec.get("prompt") is not None:
            line["prompt"] = rec["prompt"]
        text = json.dumps(line, ensure_ascii=False) + "\n"
        with self._lock:
            self._out.write(text)

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout:
            self._out.close()
