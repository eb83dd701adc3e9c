"""`lpx top`: a live view of a running server from its metrics endpoints, the same vocabulary for every target
(promql.py). Each frame compares two reads of Triton's metrics port (and of the gateway's /metrics when
there is one), `interval` seconds apart:

- requests and refusals per second, requests in the batch / waiting (the backend's request metrics),
- latency: TTFT and inter-token latency p50/p99 from the gateway's histograms; without a gateway, Triton
  has no first-token figure, so end-to-end p50/p99 (Triton's latency summary of the ensemble) and the mean
  time per output token (end-to-end / generated tokens) stand in, and say so,
- input and output tokens per second (nv_llm_input/output_token_len), the batch, the KV cache,
- per GPU utilization, memory and power where Triton reports them (nv_gpu_*; its metrics have no
  temperature), else "n/a on CPU".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import promql as q
from .scrape import Scrape, increase, quantile, rate, scrape

NA = "n/a"


@dataclass
class GpuFigures:
    uuid: str
    utilization: float | None = None
    memory_used: float | None = None
    memory_total: float | None = None
    power: float | None = None
    power_limit: float | None = None


@dataclass
class Figures:
    """One frame. Latencies in seconds, None where the source has no such figure."""

    requests_s: float | None = None
    refused_s: float | None = None
    in_batch: float | None = None
    waiting: float | None = None
    max_active: float | None = None
    context: float | None = None
    input_tokens_s: float | None = None
    output_tokens_s: float | None = None
    ttft: tuple[float | None, float | None] = (None, None)
    itl: tuple[float | None, float | None] = (None, None)
    e2e: tuple[float | None, float | None] = (None, None)
    per_token_mean: float | None = None
    latency_source: str = ""
    kv_used: float | None = None
    kv_max: float | None = None
    tokens_per_block: float | None = None
    cpu_utilization: float | None = None
    cpu_memory: float | None = None
    gpus: list[GpuFigures] = field(default_factory=list)


def _gauge(s: Scrape, family: str, key: str, value: str) -> float | None:
    return s.total(family, model=q.ENGINE_MODEL, **{key: value})


def figures(
    prev: Scrape, cur: Scrape, gw_prev: Scrape | None = None, gw_cur: Scrape | None = None
) -> Figures:
    """The frame between two reads of Triton (and of the gateway, when given)."""
    f = Figures()
    f.requests_s = rate(prev, cur, q.SUCCESS, model=q.ENGINE_MODEL)
    refused = tuple(q.ENTRY_MODELS.split("|")) + (q.ENGINE_MODEL,)
    f.refused_s = rate(prev, cur, q.FAILURE, model=refused)
    f.in_batch = _gauge(cur, q.REQUESTS, "request_type", "scheduled")
    f.waiting = _gauge(cur, q.REQUESTS, "request_type", "waiting")
    f.max_active = _gauge(cur, q.REQUESTS, "request_type", "max")
    f.context = _gauge(cur, q.REQUESTS, "request_type", "context")
    f.input_tokens_s = rate(prev, cur, f"{q.INPUT_TOKENS}_sum", model=q.ENGINE_MODEL)
    f.output_tokens_s = rate(prev, cur, f"{q.OUTPUT_TOKENS}_sum", model=q.ENGINE_MODEL)
    f.kv_used = _gauge(cur, q.KV_BLOCKS, "kv_cache_block_type", "used")
    f.kv_max = _gauge(cur, q.KV_BLOCKS, "kv_cache_block_type", "max")
    f.tokens_per_block = _gauge(cur, q.KV_BLOCKS, "kv_cache_block_type", "tokens_per")
    f.cpu_utilization, f.cpu_memory = cur.total(q.CPU_UTILIZATION), cur.total(q.CPU_MEMORY_USED)
    if gw_prev is not None and gw_cur is not None and gw_cur.samples.get(f"{q.GATEWAY_TTFT}_bucket"):
        f.latency_source = "gateway histograms"
        for name, attr in ((q.GATEWAY_TTFT, "ttft"), (q.GATEWAY_ITL, "itl"), (q.GATEWAY_E2E, "e2e")):
            setattr(f, attr, (quantile(0.5, gw_prev, gw_cur, name), quantile(0.99, gw_prev, gw_cur, name)))
        if f.requests_s is None:  # a server without Triton's counters on this port: the gateway's own
            f.requests_s = rate(gw_prev, gw_cur, q.GATEWAY_REQUESTS)
    else:
        f.latency_source = "Triton (no gateway: no first-token figure)"
        summary = [cur.total(q.REQUEST_SUMMARY, model="ensemble", quantile=p) for p in ("0.5", "0.99")]
        f.e2e = (
            None if summary[0] is None else summary[0] / 1e6,
            None if summary[1] is None else summary[1] / 1e6,
        )
        done = increase(prev, cur, q.SUCCESS, model="ensemble")
        spent = increase(prev, cur, q.REQUEST_DURATION, model="ensemble")
        tokens = increase(prev, cur, f"{q.OUTPUT_TOKENS}_sum", model=q.ENGINE_MODEL)
        requests = increase(prev, cur, f"{q.OUTPUT_TOKENS}_count", model=q.ENGINE_MODEL)
        if done and spent and tokens and requests:
            f.per_token_mean = (spent / 1e6 / done) / (tokens / requests)
    for labels, _ in cur.select(q.GPU_UTILIZATION):
        uuid = labels.get("gpu_uuid", "?")
        f.gpus.append(
            GpuFigures(
                uuid,
                cur.total(q.GPU_UTILIZATION, gpu_uuid=uuid),
                cur.total(q.GPU_MEMORY_USED, gpu_uuid=uuid),
                cur.total(q.GPU_MEMORY_TOTAL, gpu_uuid=uuid),
                cur.total(q.GPU_POWER, gpu_uuid=uuid),
                cur.total(q.GPU_POWER_LIMIT, gpu_uuid=uuid),
            )
        )
    return f


def _num(v: float | None, fmt: str = "{:.1f}", unit: str = "") -> str:
    return NA if v is None else fmt.format(v) + unit


def _ms(v: float | None) -> str:
    return NA if v is None else f"{v * 1000:.0f} ms"


def _pair(p: tuple[float | None, float | None]) -> str:
    return f"{_ms(p[0])} / {_ms(p[1])}"


def _gib(v: float | None) -> str:
    return NA if v is None else f"{v / 2**30:.1f} GiB"


def render(f: Figures, title: str = ""):
    """The frame as rich renderables: the serving table and the GPU table."""
    from rich.console import Group
    from rich.table import Table

    t = Table(title=title or None, show_header=False, box=None, pad_edge=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("requests/s", f"{_num(f.requests_s, '{:.2f}')}   refused/s {_num(f.refused_s, '{:.2f}')}")
    t.add_row(
        "requests",
        f"{_num(f.in_batch, '{:.0f}')} in the batch ({_num(f.context, '{:.0f}')} in their prompt), "
        f"{_num(f.waiting, '{:.0f}')} waiting, max {_num(f.max_active, '{:.0f}')}",
    )
    if f.ttft != (None, None) or f.itl != (None, None) or f.latency_source.startswith("gateway"):
        t.add_row("TTFT p50 / p99", _pair(f.ttft))
        t.add_row("ITL p50 / p99", _pair(f.itl))
    else:
        t.add_row("TTFT / ITL", f"{NA} (pass --gateway URL for per-token latency histograms)")
        t.add_row("per output token", f"{_ms(f.per_token_mean)} (mean: end-to-end / generated tokens)")
    t.add_row("end-to-end p50 / p99", f"{_pair(f.e2e)}   ({f.latency_source})")
    t.add_row("tokens/s in / out", f"{_num(f.input_tokens_s)} / {_num(f.output_tokens_s)}")
    kv = NA
    if f.kv_used is not None and f.kv_max:
        kv = f"{f.kv_used / f.kv_max:.1%} ({f.kv_used:.0f} of {f.kv_max:.0f} blocks"
        kv += f" of {f.tokens_per_block:.0f} tokens)" if f.tokens_per_block else ")"
    t.add_row("KV cache", kv)
    t.add_row("CPU", f"{_num(f.cpu_utilization, '{:.0%}')} busy, {_gib(f.cpu_memory)} used")
    gpus = Table(show_header=True, box=None, pad_edge=False, header_style="bold")
    for column in ("GPU", "util", "memory", "power", "temp"):
        gpus.add_column(column)
    for g in f.gpus:
        power = _num(g.power, "{:.0f}", " W") + (f" / {g.power_limit:.0f} W" if g.power_limit else "")
        memory = f"{_gib(g.memory_used)} / {_gib(g.memory_total)}"
        gpus.add_row(
            g.uuid[:12], _num(g.utilization, "{:.0%}"), memory, power, f"{NA} (not in Triton's metrics)"
        )
    if not f.gpus:
        gpus.add_row("-", f"{NA} on CPU", NA, NA, NA)
    return Group(t, gpus)


def frame(triton_url: str, gateway_url: str | None, interval_s: float, prev=None) -> tuple[Figures, tuple]:
    """Read the endpoints (twice, `interval_s` apart, without an earlier read) and compute the frame;
    returns it with this read, to pass as `prev` next time."""
    if prev is None:
        prev = (scrape(triton_url), scrape(gateway_url) if gateway_url else None)
        time.sleep(interval_s)
    cur = (scrape(triton_url), scrape(gateway_url) if gateway_url else None)
    return figures(prev[0], cur[0], prev[1], cur[1]), cur


def run(triton_url: str, gateway_url: str | None, interval_s: float, once: bool, console) -> None:
    """Render frames until Ctrl-C (one with `once`)."""
    from rich.live import Live

    title = f"lpx top - {triton_url}" + (f" + gateway {gateway_url}" if gateway_url else "")
    try:
        fig, last = frame(triton_url, gateway_url, interval_s)
        if once:
            console.print(render(fig, title))
            return
        with Live(render(fig, title), console=console, refresh_per_second=4, transient=False) as live:
            while True:
                time.sleep(interval_s)
                fig, last = frame(triton_url, gateway_url, interval_s, last)
                live.update(render(fig, f"{title}   {time.strftime('%H:%M:%S')}"))
    except KeyboardInterrupt:  # Ctrl-C is how a live view ends
        pass
