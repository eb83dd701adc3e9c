"""The metric vocabulary on a real server: a tritonserver serving the demo's torch engine, a real Prometheus
(Debian's binary, `make monitoring-tools`) scraping it every second with `lpx monitoring`'s rules, load from
concurrent streams. While the load runs: Triton publishes the TensorRT-LLM backend's families exactly as the
contract pins them, with real engine state; the recorded series and the HPA's queue/compute ratio move; the
dashboard's queries return data; `lpx top --once` shows non-zero figures.

Needs tritonserver (nvidia-pytriton) and Prometheus; skipped, naming the fix, without them.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from helpers_monitoring import prometheus_server, tool

from pipeline.monitoring import dashboard
from pipeline.monitoring import promql as q
from pipeline.monitoring.rules import rule_groups
from pipeline.monitoring.scrape import scrape
from pipeline.monitoring.write import write_monitoring

pytestmark = [pytest.mark.triton, pytest.mark.slow]
CONTRACT = json.loads((Path(__file__).parent / "contracts" / "trtllm_backend_metrics.json").read_text())
TARGET_LABELS = {"namespace": "lpx-test", "pod": "local"}  # what Kubernetes would put on a pod's series
CONCURRENCY = 10  # above the demo engine's max_batch_size (8): requests wait
PROMPTS = ["Bread is made", "A good engineer", "Numbers tell stories", "The first token of an answer"]


@pytest.fixture(scope="module")
def prometheus_bin() -> Path:
    return tool("prometheus")  # skips before Triton starts when Prometheus is missing


@pytest.fixture(scope="module")
def server(prometheus_bin, torch_triton):
    return torch_triton  # conftest.py: one server per session, shared with test_triton_e2e


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prometheus")
    write_monitoring(folder / "monitoring")
    for prom in prometheus_server(
        folder, [server.metrics_url], [folder / "monitoring" / "prometheus-rules.yml"], TARGET_LABELS
    ):
        wait_for(lambda: prom.query(_iterations()), "Prometheus's first scrape of Triton")  # noqa: B023
        yield prom


class Load:
    """CONCURRENCY closed-loop streams against the ensemble until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.done, self.errors = url, 0, []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(CONCURRENCY)
        ]

    def _loop(self, i: int) -> None:
        from pipeline.client import generate_stream

        while not self._stop.is_set():
            try:
                list(generate_stream(self.url, PROMPTS[i % len(PROMPTS)], 48, model="ensemble"))
                self.done += 1
            except Exception as exc:  # a failed request fails the test below
                self.errors.append(exc)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)


def wait_for(check, what: str, timeout_s: float = 40.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:.0f}s")
        time.sleep(0.5)


def published_families(url: str) -> dict[str, set[tuple[str, str]]]:
    """Triton's TensorRT-LLM backend families now: family -> {(category label, value)}, with their TYPE."""
    from urllib.request import ProxyHandler, build_opener

    text = build_opener(ProxyHandler({})).open(f"http://{url}/metrics", timeout=10).read().decode()
    types = dict(re.findall(r"^# TYPE (nv_(?:trt_)?llm_\w+) (\w+)$", text, re.M))
    out: dict[str, set[tuple[str, str]]] = {name: set() for name in types}
    for name in types:
        label = CONTRACT["families"].get(name, {}).get("label", "")
        for value in re.findall(rf'^{name}(?:_bucket|_sum|_count)?{{[^}}]*\b{label}="(\w+)"', text, re.M):
            out[name].add((types[name], value))
    return out


def test_torch_serves_the_backends_vocabulary_rules_and_dashboard_move_under_load(server, prometheus) -> None:
    before = {
        name: prometheus.value(expr)
        for name, expr in (("queue", "lpx:queue_compute_ratio"), ("iterations", _iterations()))
    }
    from pipeline.monitoring.top import run

    with Load(server.grpc_url) as load:
        # the recorded series move: requests in the batch and waiting, KV blocks, tokens, the HPA's ratio
        wait_for(lambda: (prometheus.value(q.SCHEDULED) or 0) > 0, "requests in the batch recorded")
        wait_for(lambda: (prometheus.value(q.KV_USED) or 0) > 0, "KV-cache blocks in use recorded")
        wait_for(lambda: (prometheus.value(q.OUTPUT_TOKEN_RATE) or 0) > 0, "output tokens/s recorded")
        wait_for(lambda: (prometheus.value(q.REQUEST_RATE) or 0) > 0, "requests/s recorded")
        wait_for(
            lambda: (prometheus.value("max_over_time(lpx:requests_waiting[1m])") or 0) > 0, "waiting requests"
        )
        ratio = wait_for(lambda: prometheus.query("lpx:queue_compute_ratio"), "the queue/compute ratio")
        assert ratio[0][0] == {"__name__": "lpx:queue_compute_ratio", **TARGET_LABELS}, "per (namespace, pod)"
        wait_for(
            lambda: (prometheus.value("lpx:queue_compute_ratio") or 0) > (before["queue"] or 0),
            "HPA metric up",
        )
        families = published_families(server.metrics_url)
        # every dashboard query that does not need the gateway or a GPU returns data for torch
        answered = {
            expr: bool(prometheus.query(_concrete(expr)))
            for expr in dashboard.queries()
            if not _needs_gateway_or_gpu(expr)
        }
        # lpx top, one frame, while the load runs
        from rich.console import Console

        console = Console(record=True, width=120)
        run(server.metrics_url, None, 3.0, True, console)  # a window in which requests finish
        frame = console.export_text()
    assert load.errors == [] and load.done > 0
    assert before["iterations"] is not None and prometheus.value(_iterations()) > before["iterations"]
    assert [expr for expr, ok in answered.items() if not ok] == []
    # Triton's /metrics: exactly the contract's families for an in-flight batching model, kinds and labels
    contract = {
        name: {(f["type"], v) for v in f["values"]}
        for name, f in CONTRACT["families"].items()
        if name != "nv_trt_llm_v1_metrics"
    }
    assert families == contract
    # the frame shows the load: requests in the batch, tokens/s, KV cache, e2e latency
    assert re.search(r"requests\s+[1-9]\d* in the batch", frame), frame
    tokens = re.search(r"tokens/s in / out\s+([\d.]+) / ([\d.]+)", frame)
    assert tokens and float(tokens.group(1)) > 0 and float(tokens.group(2)) > 0, frame
    kv = re.search(r"KV cache\s+([\d.]+)%", frame)
    assert kv and float(kv.group(1)) > 0, frame
    assert re.search(r"end-to-end p50 / p99\s+\d+ ms / \d+ ms", frame), frame
    assert "n/a on CPU" in frame, "no GPU here: said so"


def _iterations() -> str:
    return f'max({q.GENERAL}{{general_type="iteration_counter"}})'


def _concrete(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$namespace", ".*").replace("$pod", ".*")


def _needs_gateway_or_gpu(expr: str) -> bool:
    return "lpx_gateway_" in expr or "nv_gpu_" in expr or "gpu_memory" in expr


def test_rule_groups_are_loaded_and_healthy(prometheus) -> None:
    """Prometheus loaded every group lpx monitoring wrote, and no rule failed to evaluate."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    groups = json.loads(opener.open(f"{prometheus.url}/api/v1/rules", timeout=10).read())["data"]["groups"]
    assert sorted(g["name"] for g in groups) == sorted(g["name"] for g in rule_groups())
    unhealthy = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] == "err"]
    assert unhealthy == []


def test_scrape_reads_what_prometheus_reads(server, prometheus) -> None:
    """lpx top's parser and Prometheus agree on the engine's gauges (same endpoint, same instant)."""
    ours = scrape(server.metrics_url).total(q.KV_BLOCKS, model=q.ENGINE_MODEL, kv_cache_block_type="max")
    theirs = prometheus.value(f'{q.KV_BLOCKS}{{kv_cache_block_type="max"}}')
    assert ours == theirs == 256.0, "the demo engine: 8 sequences x 1024 tokens / 32 per block"
