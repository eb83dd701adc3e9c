"""`lpx monitoring --out DIR`: the dashboard and the rules as files.

dashboard.json                    the Grafana dashboard (import it, or provision it from a file)
grafana-dashboard-configmap.yaml  the same in a ConfigMap labelled grafana_dashboard: "1", which the
                                  Grafana Helm chart's sidecar loads
prometheus-rules.yml              the rule groups, as a Prometheus rule file (promtool checks it)
prometheus-rule.yaml              the same groups in a PrometheusRule, for the Prometheus Operator
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import UsageError
from .dashboard import UID, dashboard_json
from .rules import Thresholds, rule_groups

FILES = ("dashboard.json", "grafana-dashboard-configmap.yaml", "prometheus-rules.yml", "prometheus-rule.yaml")
LABELS = {"app.kubernetes.io/name": "lpx", "app.kubernetes.io/part-of": "lpx"}


def configmap(namespace: str, board: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{UID}-dashboard",
            "namespace": namespace,
            "labels": {**LABELS, "grafana_dashboard": "1"},
        },
        "data": {f"{UID}.json": board},
    }


def prometheus_rule(namespace: str, groups: list[dict]) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "lpx-monitoring", "namespace": namespace, "labels": dict(LABELS)},
        "spec": {"groups": groups},
    }


def _yaml(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=False, width=120, allow_unicode=True)


def write_monitoring(
    out: Path, thresholds: Thresholds | None = None, namespace: str = "lpx", autoscaling: bool = True
) -> list[Path]:
    """Write FILES into `out` (created; files of the same names are replaced); returns their paths.
    `autoscaling`: with the queue/compute ratio's recording rule (rules.py)."""
    groups = rule_groups(thresholds or Thresholds(), autoscaling)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file - pass a folder (it is created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    board = dashboard_json()
    texts = {
        "dashboard.json": board,
        "grafana-dashboard-configmap.yaml": _yaml(configmap(namespace, board)),
        "prometheus-rules.yml": _yaml({"groups": groups}),
        "prometheus-rule.yaml": _yaml(prometheus_rule(namespace, groups)),
    }
    paths = []
    for name in FILES:
        path = out / name
        path.write_text(texts[name], encoding="utf-8")
        paths.append(path)
    return paths
