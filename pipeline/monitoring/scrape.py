"""Reading a Prometheus text endpoint (Triton's metrics port, the gateway's /metrics) with prometheus_client's
parser, and what `lpx top` derives from two reads: rates of counters and quantiles of histograms over the
time between them (as PromQL's rate() and histogram_quantile() would over that window)."""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from ..errors import NotFound, UsageError

Labels = dict[str, str]


def metrics_url(url: str) -> str:
    """HOST:PORT, http://HOST:PORT or a full URL -> the URL to read (path /metrics unless one is given)."""
    url = url.strip()
    if not url:
        raise UsageError("--url is empty - pass HOST:PORT of Triton's metrics port (default 8002)")
    if "://" not in url:
        url = f"http://{url}"
    scheme, rest = url.split("://", 1)
    return url if "/" in rest.strip("/") else f"{scheme}://{rest.rstrip('/')}/metrics"


@dataclass
class Scrape:
    """One read of an endpoint: when, and every sample by its name (a histogram's _bucket, _sum, _count)."""

    at: float
    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)

    def select(self, name: str, **labels: str | tuple[str, ...]) -> list[tuple[Labels, float]]:
        """The samples of `name` whose labels match (a tuple matches any of its values)."""

        def match(have: Labels) -> bool:
            return all(
                have.get(k) in (want if isinstance(want, tuple) else (want,)) for k, want in labels.items()
            )

        return [(lab, v) for lab, v in self.samples.get(name, []) if match(lab)]

    def total(self, name: str, **labels: str | tuple[str, ...]) -> float | None:
        """The sum of the matching samples (NaN ones left out); None when there is none."""
        values = [v for _, v in self.select(name, **labels) if not math.isnan(v)]
        return sum(values) if values else None


def parse(text: str, at: float | None = None) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    out = Scrape(time.time() if at is None else at)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names = [sample.name]
            if family.type == "counter" and sample.name.endswith("_total"):
                # the parser adds _total to a counter's samples; Prometheus keeps the name as written
                # (Triton's nv_inference_request_success), so both spellings are kept
                names.append(sample.name[: -len("_total")])
            for name in names:
                out.samples.setdefault(name, []).append((dict(sample.labels), float(sample.value)))
    return out


def scrape(url: str, timeout_s: float = 5.0) -> Scrape:
    """Read and parse one endpoint; a NotFound naming the URL and the fix when nothing answers."""
    target = metrics_url(url)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the servers are local or direct
    try:
        with opener.open(target, timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise UsageError(
                f"{target} asks for an API key (HTTP {exc.code}) - list /metrics in the gateway's "
                "serving.openai.open_routes (the default) or read it from inside the cluster"
            ) from None
        raise NotFound(f"{target} answered HTTP {exc.code} - is it a metrics endpoint?") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise NotFound(
            f"No metrics at {target} ({reason}) - is the server running? Pass --url HOST:PORT of Triton's "
            "metrics port (lpx serve prints it; 8002 in the container)"
        ) from None
    try:
        return parse(text)
    except ValueError as exc:
        raise NotFound(
            f"{target} did not answer Prometheus metrics ({exc}) - is it a metrics port?"
        ) from None


def rate(prev: Scrape, cur: Scrape, name: str, **labels: str | tuple[str, ...]) -> float | None:
    """Per-second increase of a counter between two reads (a restart counts from 0); None if absent."""
    a, b = prev.total(name, **labels), cur.total(name, **labels)
    dt = cur.at - prev.at
    if b is None or dt <= 0:
        return None
    a = 0.0 if a is None or b < a else a
    return (b - a) / dt


def increase(prev: Scrape, cur: Scrape, name: str, **labels: str | tuple[str, ...]) -> float | None:
    per_s = rate(prev, cur, name, **labels)
    return None if per_s is None else per_s * (cur.at - prev.at)


def quantile(
    q: float, prev: Scrape, cur: Scrape, histogram: str, **labels: str | tuple[str, ...]
) -> float | None:
    """The q-quantile of the observations a histogram got between two reads (its buckets summed over every
    other label), interpolated within a bucket as PromQL's histogram_quantile; None without observations."""
    buckets: dict[float, float] = {}
    for lab, value in cur.select(f"{histogram}_bucket", **labels):
        le = float(lab["le"])
        before = [v for lb, v in prev.select(f"{histogram}_bucket", **labels) if lb == lab]
        grown = value - before[0] if before and value >= before[0] else value
        buckets[le] = buckets.get(le, 0.0) + grown
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):  # in the open bucket: the largest finite bound, as PromQL answers
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower
