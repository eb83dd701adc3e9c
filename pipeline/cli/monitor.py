"""`lpx top` (a live view of a running server) and `lpx monitoring` (dashboard and Prometheus rules as files)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("top")
@click.option(
    "--url",
    default=None,
    help="Triton's metrics endpoint, HOST:PORT or a URL (default: the running 'lpx serve').",
)
@click.option(
    "--gateway",
    default=None,
    help="The OpenAI gateway's base URL or /metrics, for TTFT and ITL histograms (default: the running "
    "'lpx serve''s gateway, if any).",
)
@click.option(
    "--interval",
    type=float,
    default=2.0,
    show_default=True,
    help="Seconds between frames (token counts arrive as requests finish: a window longer than a request "
    "gives steadier figures).",
)
@click.option("--once", is_flag=True, help="Render one frame (two reads, --interval apart) and exit.")
def top(url: str | None, gateway: str | None, interval: float, once: bool) -> None:
    """Requests/s and refusals, requests in the batch and waiting, TTFT / ITL p50 and p99, tokens/s, the
    KV cache and each GPU of a running server, from its metrics endpoints; Ctrl-C to stop."""
    from rich.console import Console

    from ..errors import UsageError
    from ..monitoring.top import run

    if interval <= 0:
        raise UsageError(f"--interval {interval} must be above 0 seconds")
    if url is None:
        from ..served import running_server

        info = running_server()
        url = info["metrics_url"]
        openai = info.get("openai_url")
        gateway = gateway or (f"{openai.rstrip('/')}/metrics" if openai else None)
    run(url, gateway, interval, once, Console())


@click.command("monitoring")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("deploy/monitoring"),
    show_default=True,
    help="Folder to write.",
)
@click.option(
    "--namespace", default="lpx", show_default=True, help="Namespace of the ConfigMap and PrometheusRule."
)
@click.option(
    "--slo", default=None, help="The TTFT SLO the alert holds p99 to, e.g. ttft=500ms (default 2s)."
)
@click.option(
    "--error-ratio", type=float, default=None, help="Alert above this share of refused requests (0.05)."
)
@click.option(
    "--kv-cache", type=float, default=None, help="Alert above this share of KV-cache blocks used (0.9)."
)
@click.option(
    "--gpu-memory", type=float, default=None, help="Alert above this share of a GPU's memory (0.95)."
)
@click.option(
    "--queue-ratio",
    type=float,
    default=None,
    help="Alert above this queue/compute time ratio, still rising (2).",
)
@click.option(
    "--no-autoscaling-rule",
    is_flag=True,
    help="Leave out lpx:queue_compute_ratio's recording rule: lpx deploy k8s's PrometheusRule records it.",
)
def monitoring(
    out: Path, namespace: str, slo, error_ratio, kv_cache, gpu_memory, queue_ratio, no_autoscaling_rule
) -> None:
    """The Grafana dashboard (JSON, and a ConfigMap for Grafana's sidecar) and the Prometheus recording and
    alerting rules (a rule file, and a PrometheusRule), the same for every build target."""
    from dataclasses import replace

    from ..bench.metrics import parse_slo
    from ..errors import UsageError
    from ..monitoring.rules import Thresholds
    from ..monitoring.write import write_monitoring

    thresholds = Thresholds()
    slos = parse_slo(slo)
    if set(slos) - {"ttft"}:
        raise UsageError(f"--slo {slo}: only ttft has an alert - pass e.g. --slo ttft=500ms")
    changes = {
        "ttft_p99_s": slos["ttft"] / 1e3 if "ttft" in slos else None,
        "error_ratio": error_ratio,
        "kv_cache_used": kv_cache,
        "gpu_memory_used": gpu_memory,
        "queue_ratio": queue_ratio,
    }
    for name, value in changes.items():
        if value is not None and value <= 0:
            raise UsageError(f"the {name.replace('_', ' ')} threshold must be above 0 (got {value})")
    thresholds = replace(thresholds, **{k: v for k, v in changes.items() if v is not None})
    for path in write_monitoring(out, thresholds, namespace, autoscaling=not no_autoscaling_rule):
        click.echo(f"wrote {path}")
