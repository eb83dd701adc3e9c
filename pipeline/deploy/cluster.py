"""The cluster objects around LPX's pods (k8s.py builds the pods and workloads).

base/ (every arch shares them): Services (ClusterIP, and headless for gRPC) selecting every arch's pods,
the NetworkPolicy, ServiceMonitor and PrometheusRule. overlays/<arch>/ (per_arch_objects): the HPA and
PodDisruptionBudget of that arch's workload and, for a LeaderWorkerSet, the policy that opens the group's
ports (sshd, MPI, NCCL) to the group. No Service is named like a workload: the LeaderWorkerSet controller
creates its headless Service (the group's DNS names) under the LWS's name only if none exists."""

from __future__ import annotations

from typing import Any

from ..config import Config
from ..errors import UsageError
from .k8s import (
    PORTS,
    QUEUE_RATIO,
    QUEUE_RATIO_EXPR,
    app_name,
    arch_labels,
    config_map,
    is_lws,
    meta,
    resource,
    workload_name,
)


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


def disruption_budget(cfg: Config, variant: str, arch: str) -> dict[str, Any] | None:
    """At most one pod of the arch down at a time - written only when autoscaling.min_replicas >= 2: with one
    replica a budget protects nothing (maxUnavailable 1) or blocks every node drain (minAvailable 1)."""
    if cfg.deploy.autoscaling.min_replicas < 2:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(cfg, variant, workload_name(cfg, variant, arch)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": arch_labels(cfg, variant, arch)}},
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


def monitoring_meta(cfg: Config, variant: str) -> dict[str, Any]:
    """Metadata with deploy.prometheus_labels (kube-prometheus-stack selects `release: <its name>`)."""
    m = meta(cfg, variant, app_name(cfg, variant))
    m["labels"] = {**m["labels"], **cfg.deploy.prometheus_labels}
    return m


def service_monitor(cfg: Config, variant: str) -> dict[str, Any]:
    name = app_name(cfg, variant)
    return resource(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        monitoring_meta(cfg, variant),
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
        monitoring_meta(cfg, variant),
        {
            "groups": [
                {
                    "name": f"{name}.autoscaling",
                    "rules": [
                        {"record": QUEUE_RATIO, "expr": QUEUE_RATIO_EXPR},
                        {
                            "alert": "LpxQueueingAboveCompute",
                            # this variant's pods only (<workload>-<hash>-<id> or <workload>-<group>...)
                            "expr": f'avg({QUEUE_RATIO}{{namespace="{cfg.deploy.namespace}", '
                            f'pod=~"{name}-sm[0-9]+-.+"}}) > '
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


def autoscaler(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    """HPA of one arch's workload on the per-pod queue/compute ratio, which prometheus-adapter serves as a
    Pods metric named after the recording rule (docs/deploy.md has the adapter rule). It owns the replica
    count: the workloads set no spec.replicas, so re-applying them keeps what the HPA chose."""
    name = workload_name(cfg, variant, arch)
    a = cfg.deploy.autoscaling
    if cfg.deploy.replicas not in (1, a.min_replicas):  # 1: the default, which says nothing
        raise UsageError(
            f"deploy.replicas: {cfg.deploy.replicas} is Dynamo's worker count; on Kubernetes the HPA owns the "
            f"count, between deploy.autoscaling.min_replicas ({a.min_replicas}) and max_replicas "
            f"({a.max_replicas}) - set deploy.autoscaling.min_replicas: {cfg.deploy.replicas} (and max_replicas "
            "at least that) to start with that many"
        )
    kind = "LeaderWorkerSet" if is_lws(cfg) else "Deployment"
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


def group_policy(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    """A LeaderWorkerSet's pods reach each other on every port (sshd 2222 for mpirun, then MPI's and
    NCCL's dynamic TCP ports); nothing else gets those ports."""
    name = workload_name(cfg, variant, arch)
    group = {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": name}}
    return resource(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        meta(cfg, variant, f"{name}-group"),
        {"podSelector": group, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": group}]}]},
    )


def base_objects(cfg: Config, variant: str) -> list[dict[str, Any]]:
    """The objects every arch shares."""
    return [
        config_map(cfg, variant),
        *services(cfg, variant),
        network_policy(cfg, variant),
        service_monitor(cfg, variant),
        prometheus_rule(cfg, variant),
    ]


def per_arch_objects(cfg: Config, variant: str, arch: str) -> list[dict[str, Any]]:
    """The objects of one arch's workload (its overlay)."""
    objects = [autoscaler(cfg, variant, arch), disruption_budget(cfg, variant, arch)]
    if is_lws(cfg):
        objects.append(group_policy(cfg, variant, arch))
    return [o for o in objects if o is not None]
