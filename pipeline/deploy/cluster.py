"""The cluster objects around LPX's pods (k8s.py builds the pods and workloads): Services (ClusterIP, and
headless for gRPC), PodDisruptionBudget, NetworkPolicy, ServiceMonitor, PrometheusRule (the queue/compute
ratio) and the HPA on it. Every arch shares them: they are deploy's base/."""

from __future__ import annotations

from typing import Any

from ..config import Config
from .k8s import PORTS, QUEUE_RATIO, QUEUE_RATIO_EXPR, app_name, meta, resource, world_size


def services(cfg: Config, variant: str) -> list[dict[str, Any]]:
    name = app_name(cfg, variant)
    selector = {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "server"}
    ports = [{"name": n, "port": PORTS[n], "targetPort": n} for n in ("openai", "http", "metrics")]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(cfg, variant, name),
            "spec": {"type": "ClusterIP", "selector": selector, "ports": ports},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(cfg, variant, f"{name}-grpc"),
            "spec": {
                "clusterIP": "None",  # headless: clients resolve every pod and balance gRPC themselves
                "selector": selector,
                "ports": [{"name": "grpc", "port": PORTS["grpc"], "targetPort": "grpc"}],
            },
        },
    ]


def disruption_budget(cfg: Config, variant: str) -> dict[str, Any]:
    name = app_name(cfg, variant)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(cfg, variant, name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/instance": name}}},
    }


def network_policy(cfg: Config, variant: str) -> dict[str, Any]:
    """Ingress: the OpenAI port from anywhere in the cluster; Triton's own ports only from this namespace;
    metrics from the monitoring namespace. Egress is left open (object store, DNS)."""
    name = app_name(cfg, variant)
    port = lambda n: {"protocol": "TCP", "port": PORTS[n]}  # noqa: E731
    return resource(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        meta(cfg, variant, name),
        {
            "podSelector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"namespaceSelector": {}}], "ports": [port("openai")]},
                {"from": [{"podSelector": {}}], "ports": [port("http"), port("grpc")]},
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {
                                    "kubernetes.io/metadata.name": cfg.deploy.monitoring_namespace
                                }
                            }
                        }
                    ],
                    "ports": [port("metrics"), port("openai")],
                },
            ],
        },
    )


def service_monitor(cfg: Config, variant: str) -> dict[str, Any]:
    name = app_name(cfg, variant)
    return resource(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        meta(cfg, variant, name),
        {
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "endpoints": [
                {"port": "metrics", "path": "/metrics", "interval": "15s"},
                {"port": "openai", "path": "/metrics", "interval": "15s"},
            ],
        },
    )


def prometheus_rule(cfg: Config, variant: str) -> dict[str, Any]:
    name = app_name(cfg, variant)
    return resource(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        meta(cfg, variant, name),
        {
            "groups": [
                {
                    "name": f"{name}.autoscaling",
                    "rules": [
                        {"record": QUEUE_RATIO, "expr": QUEUE_RATIO_EXPR},
                        {
                            "alert": "LpxQueueingAboveCompute",
                            "expr": f'avg({QUEUE_RATIO}{{namespace="{cfg.deploy.namespace}"}}) > '
                            f"{2 * cfg.deploy.autoscaling.queue_compute_ratio:g}",
                            "for": "10m",
                            "labels": {"severity": "warning"},
                            "annotations": {
                                "summary": "Requests wait longer than they compute; the HPA is at its maximum "
                                "or cannot place pods (no free GPUs)"
                            },
                        },
                    ],
                }
            ]
        },
    )


def autoscaler(cfg: Config, variant: str) -> dict[str, Any]:
    """HPA on the per-pod queue/compute ratio, which prometheus-adapter serves as a Pods metric
    named after the recording rule (docs/deploy.md has the adapter rule)."""
    name = app_name(cfg, variant)
    a = cfg.deploy.autoscaling
    kind = "LeaderWorkerSet" if world_size(cfg) > cfg.deploy.gpus_per_node else "Deployment"
    api = "leaderworkerset.x-k8s.io/v1" if kind == "LeaderWorkerSet" else "apps/v1"
    return resource(
        "autoscaling/v2",
        "HorizontalPodAutoscaler",
        meta(cfg, variant, name),
        {
            "scaleTargetRef": {"apiVersion": api, "kind": kind, "name": name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_RATIO.replace(":", "_")},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": f"{int(a.queue_compute_ratio * 1000)}m",
                        },
                    },
                }
            ],
            # scale down slowly: a new replica costs an engine load
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
        },
    )


def base_objects(cfg: Config, variant: str) -> list[dict[str, Any]]:
    """The objects every arch shares."""
    return [
        *services(cfg, variant),
        disruption_budget(cfg, variant),
        network_policy(cfg, variant),
        service_monitor(cfg, variant),
        prometheus_rule(cfg, variant),
        autoscaler(cfg, variant),
    ]
