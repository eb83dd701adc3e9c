"""Kubernetes objects for one variant, as Python data (dumped to YAML by deploy/write.py; no templates).

The pod (Deployment, or a LeaderWorkerSet when tp x pp needs more GPUs than one node has):
- `triton`: `lpx serve --repo /models` in LPX's image (the Dockerfile: Triton TensorRT-LLM base, or the
  slim image for the torch target): it picks the repository built for the GPU present and runs one
  Triton rank per GPU, as on a workstation. Probes on Triton's /v2/health/{live,ready}; a startup probe
  allows engine loading its time.
- `gateway`: LPX's OpenAI gateway (the slim image) in front of Triton's gRPC on localhost, keys from a
  Secret, /health/* probes.
- the model repositories mounted read-only (a PVC, or an init container that fetches CI's
  lpx-repos.tgz and checks its sha256); /dev/shm as a memory emptyDir; LPX_HOME and /tmp as emptyDirs,
  so the root filesystem stays read-only; non-root, no privilege escalation, all capabilities dropped.
- GPUs: nvidia.com/gpu requests = limits, and node affinity on GPU Feature Discovery's compute
  capability labels (nvidia.com/gpu.compute.major / .minor) for the variant's arch.
Around it (cluster.py): a Service (HTTP, OpenAI, metrics), a headless Service for gRPC (a ClusterIP pins one gRPC
connection to one pod; headless lets clients balance), PodDisruptionBudget, NetworkPolicy,
ServiceMonitor, PrometheusRule (the queue/compute ratio NVIDIA's tutorial autoscales on) and an HPA on it.

Checks a scanner (checkov) would raise and that do not apply are skipped per object with a one-line
reason in its `checkov.io/skip*` annotations (SKIPS below).
"""

from __future__ import annotations

import re
from typing import Any

from ..config import Config
from ..errors import UsageError

PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
MODELS_MOUNT = "/models"
KEYS_MOUNT = "/etc/lpx/keys"
LPX_HOME = "/home/lpx/.lpx"
USER_ID = 1000
FETCH_IMAGE = "curlimages/curl:8.11.1"  # curl + busybox tar/sha256sum, runs as non-root (uid 100)
QUEUE_RATIO = "lpx:queue_compute_ratio"  # recording rule; prometheus-adapter serves it to the HPA
QUEUE_RATIO_EXPR = (
    "sum by (namespace, pod) (rate(nv_inference_queue_duration_us[1m])) / "
    "clamp_min(sum by (namespace, pod) (rate(nv_inference_compute_infer_duration_us[1m])), 1)"
)

# checkov check -> why it does not apply to LPX's pods (one line each, written into the annotations)
SKIPS = {
    "CKV_K8S_43": "images are named by tag in lpx.yaml; pin digests in an overlay once CI has pushed them",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent: GPU nodes cache multi-GB Triton images; tags are immutable",
    "CKV_K8S_35": "the gateway reads its keys from a mounted Secret file, not an environment variable",
    "CKV_K8S_40": "uid 1000 is the images' own non-root user (Dockerfile useradd)",
}
POD_SKIPS = ("CKV_K8S_43", "CKV_K8S_15", "CKV_K8S_40")


def dns_name(*parts: str) -> str:
    """A DNS-1123 label from the parts (lowercase, [a-z0-9-], at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", name)[:63].rstrip("-") or "lpx"


def sm_capability(arch: str) -> tuple[int, int]:
    """sm90 -> (9, 0), sm100 -> (10, 0), sm89 -> (8, 9)."""
    digits = re.match(r"^sm(\d+)", arch)
    if not digits:
        raise UsageError(f"'{arch}' is not a GPU architecture (e.g. sm90)")
    n = int(digits.group(1))
    return n // 10, n % 10


def world_size(cfg: Config) -> int:
    b = cfg.build
    return b.tp_size * b.pp_size if b.target == "engine" else 1


def labels(cfg: Config, variant: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "lpx",
        "app.kubernetes.io/instance": app_name(cfg, variant),
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/part-of": "lpx",
    }


def app_name(cfg: Config, variant: str) -> str:
    return dns_name("lpx", cfg.model.name, variant)


def meta(cfg: Config, variant: str, name: str, skips: tuple[str, ...] = ()) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "namespace": cfg.deploy.namespace, "labels": labels(cfg, variant)}
    if skips:
        m["annotations"] = {f"checkov.io/skip{i + 1}": f"{c}={SKIPS[c]}" for i, c in enumerate(skips)}
    return m


def resource(api: str, kind: str, metadata: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": metadata, "spec": spec}


def _security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": USER_ID,
        "runAsGroup": USER_ID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def container(
    name: str,
    image: str,
    args: list[str],
    ports: list[str],
    probes: tuple[dict, dict, dict],
    resources: dict[str, str],
    mounts: list[tuple[str, str, bool]],
) -> dict[str, Any]:
    """One locked-down container: requests = limits, LPX_HOME set, (volume, path, read-only) mounts, and
    (startup, liveness, readiness) probes."""
    startup, live, ready = probes
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": [{"name": "LPX_HOME", "value": LPX_HOME}],
        "ports": [{"name": n, "containerPort": PORTS[n]} for n in ports],
        "startupProbe": startup,
        "livenessProbe": live,
        "readinessProbe": ready,
        "resources": {"requests": resources, "limits": dict(resources)},
        "securityContext": _security(),
        "volumeMounts": [
            {"name": vol, "mountPath": path, **({"readOnly": True} if ro else {})} for vol, path, ro in mounts
        ],
    }


def triton_container(cfg: Config, variant: str, gpus: int) -> dict[str, Any]:
    d = cfg.deploy
    return container(
        "triton",
        d.slim_image if cfg.build.target == "torch" else d.image,
        ["serve", "--repo", MODELS_MOUNT, "--variant", variant, "--host", "0.0.0.0", "--no-gateway"],
        ["http", "grpc", "metrics"],
        # engine loading can take minutes on a cold node: the startup probe allows 20, then liveness rules
        (
            _probe("/v2/health/ready", "http", 10, 120),
            _probe("/v2/health/live", "http", 10, 3),
            _probe("/v2/health/ready", "http", 5, 3),
        ),
        {"cpu": d.cpu, "memory": d.memory, "nvidia.com/gpu": str(gpus)},
        [
            ("models", MODELS_MOUNT, True),
            ("dshm", "/dev/shm", False),
            ("lpx-home", LPX_HOME, False),
            ("tmp", "/tmp", False),
        ],
    )


def gateway_container(cfg: Config, variant: str) -> dict[str, Any]:
    args = ["gateway", "--triton", f"127.0.0.1:{PORTS['grpc']}", "--repo", MODELS_MOUNT, "--variant", variant]
    args += ["--host", "0.0.0.0", "--port", str(PORTS["openai"]), "--keys", f"{KEYS_MOUNT}/keys.json"]
    return container(
        "gateway",
        cfg.deploy.slim_image,
        args,
        ["openai"],
        (
            _probe("/health/live", "openai", 5, 60),
            _probe("/health/live", "openai", 10, 3),
            _probe("/health/ready", "openai", 5, 3),
        ),
        {"cpu": "2", "memory": "2Gi"},
        [
            ("models", MODELS_MOUNT, True),
            ("keys", KEYS_MOUNT, True),
            ("lpx-home", LPX_HOME, False),
            ("tmp", "/tmp", False),
        ],
    )


def fetch_container(cfg: Config) -> dict[str, Any]:
    """Init container: download CI's lpx-repos.tgz, check its sha256, unpack it into the models volume."""
    r = cfg.deploy.repository
    script = (
        'set -eu; curl -fsSL --retry 5 -o /tmp/repos.tgz "$REPOS_URL"; '
        'echo "$REPOS_SHA256  /tmp/repos.tgz" | sha256sum -c -; '
        "tar -xzf /tmp/repos.tgz -C /models; rm /tmp/repos.tgz"
    )
    resources = {"cpu": "1", "memory": "1Gi"}
    return {
        "name": "fetch-repository",
        "image": FETCH_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "env": [{"name": "REPOS_URL", "value": r.url}, {"name": "REPOS_SHA256", "value": r.sha256}],
        "resources": {"requests": resources, "limits": dict(resources)},
        "securityContext": _security(),
        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}],
    }


def affinity(arch: str) -> dict[str, Any]:
    major, minor = sm_capability(arch)
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": [str(major)]},
                            {"key": "nvidia.com/gpu.compute.minor", "operator": "In", "values": [str(minor)]},
                        ]
                    }
                ]
            }
        }
    }


def pod_spec(cfg: Config, variant: str, arch: str, gpus: int, gateway: bool = True) -> dict[str, Any]:
    d = cfg.deploy
    fetch = d.repository.url is not None
    models = (
        {"name": "models", "emptyDir": {}}
        if fetch
        else {
            "name": "models",
            "persistentVolumeClaim": {"claimName": d.repository.pvc or "lpx-models", "readOnly": True},
        }
    )
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": USER_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": affinity(arch),
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        # SIGTERM: the gateway drains its streams, then Triton stops; give both time
        "terminationGracePeriodSeconds": 60,
        "containers": [triton_container(cfg, variant, gpus)]
        + ([gateway_container(cfg, variant)] if gateway else []),
        "volumes": [
            models,
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": d.shm_size}},
            {"name": "lpx-home", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
        ]
        + (
            [{"name": "keys", "secret": {"secretName": d.keys_secret, "defaultMode": 0o400}}]
            if gateway
            else []
        ),
    }
    if fetch:
        spec["initContainers"] = [fetch_container(cfg)]
    return spec


def deployment(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    name = app_name(cfg, variant)
    return resource(
        "apps/v1",
        "Deployment",
        meta(cfg, variant, name, POD_SKIPS),
        {
            "replicas": cfg.deploy.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            # one new pod at a time, none removed before it is ready: GPUs are scarce, traffic continuous
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels(cfg, variant)},
                "spec": pod_spec(cfg, variant, arch, world_size(cfg)),
            },
        },
    )


def leader_worker_set(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    """tp x pp above one node: a group of world / gpus_per_node pods. The leader runs `lpx serve`, whose
    mpirun spans the group (stages/serve/ranks.py derives the hosts from the LWS_* variables the
    LeaderWorkerSet controller sets); workers hold their GPUs and run an SSH server on port 2222 for
    mpirun to start their ranks (the image must carry sshd and a shared key, as in NVIDIA's multi-node
    Triton guide; not exercised here: no cluster)."""
    name = app_name(cfg, variant)
    per_node = cfg.deploy.gpus_per_node
    world = world_size(cfg)
    if world % per_node:
        raise UsageError(
            f"tp_size x pp_size = {world} GPUs do not fill whole nodes of {per_node} - set "
            "deploy.gpus_per_node to a divisor of it"
        )
    leader = pod_spec(cfg, variant, arch, per_node)
    worker = pod_spec(cfg, variant, arch, per_node, gateway=False)
    rank = worker["containers"][0]
    rank["command"] = ["/usr/sbin/sshd", "-D", "-e", "-p", "2222"]
    rank.pop("args")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        rank.pop(probe)
    rank["ports"] = [{"name": "ssh", "containerPort": 2222}]
    rank["readinessProbe"] = {"tcpSocket": {"port": "ssh"}, "periodSeconds": 10}
    rank["livenessProbe"] = {"tcpSocket": {"port": "ssh"}, "periodSeconds": 20}
    return resource(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        meta(cfg, variant, name, POD_SKIPS),
        {
            "replicas": cfg.deploy.replicas,
            "leaderWorkerTemplate": {
                "size": world // per_node,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": labels(cfg, variant)}, "spec": leader},
                "workerTemplate": {
                    "metadata": {"labels": {**labels(cfg, variant), "app.kubernetes.io/component": "worker"}},
                    "spec": worker,
                },
            },
        },
    )


def workload(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    if world_size(cfg) > cfg.deploy.gpus_per_node:
        return leader_worker_set(cfg, variant, arch)
    return deployment(cfg, variant, arch)
