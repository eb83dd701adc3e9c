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
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import UsageError
from . import mpi

PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
MODELS_MOUNT = "/models"
KEYS_MOUNT = "/etc/lpx/keys"
CONFIG_MOUNT = "/etc/lpx/config"  # the deployed lpx.yaml: the sidecar's serving.openai settings
CHAT_TEMPLATE = "chat_template.jinja"  # serving.openai.chat_template's text, beside it
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


def is_lws(cfg: Config) -> bool:
    """tp x pp needs more GPUs than one node has: a LeaderWorkerSet instead of a Deployment."""
    return cfg.build.ranks > cfg.deploy.gpus_per_node


def workload_name(cfg: Config, variant: str, arch: str) -> str:
    """Each arch's workload has its own name (overlays applied together coexist: a mixed H100/B200
    cluster serves both), distinct from every Service's (the LWS controller names its headless Service
    after the LWS and creates it only when no Service has that name)."""
    return dns_name(app_name(cfg, variant), arch)


def arch_labels(cfg: Config, variant: str, arch: str) -> dict[str, str]:
    """The selector of one arch's pods."""
    return {"app.kubernetes.io/instance": app_name(cfg, variant), "lpx.dev/arch": arch}


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
        [
            "serve",
            "--repo",
            MODELS_MOUNT,
            "--variant",
            variant,
            "--host",
            "0.0.0.0",
            "--no-gateway",
            "--log-stdout",
        ],
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


def config_map(cfg: Config, variant: str) -> dict[str, Any]:
    """The deployed lpx.yaml (values that differ from LPX's defaults), mounted into the gateway sidecar: its
    serving.openai section is what the sidecar runs with, the same settings model `lpx serve` uses."""
    from ..config import dump_config

    deployed, files = cfg.model_copy(deep=True), {}
    template = cfg.serving.openai.chat_template
    if template is not None:  # a file of this machine: its text travels in the ConfigMap beside lpx.yaml
        try:
            files[CHAT_TEMPLATE] = Path(template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"serving.openai.chat_template: cannot read {template} ({exc}) - point it at the Jinja "
                "template file the gateway should use, or remove it"
            ) from None
        deployed.serving.openai.chat_template = Path(CONFIG_MOUNT) / CHAT_TEMPLATE
    name = dns_name(app_name(cfg, variant), "config")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(cfg, variant, name),
        "data": {"lpx.yaml": dump_config(deployed, exclude_defaults=True), **files},
    }


def sidecar_args(cfg: Config, variant: str, arch: str) -> list[str]:
    """`lpx gateway`'s arguments in the pod, produced here only: every serving.openai setting through
    `-c` (the ConfigMap above); the bind address, port and keys file are the pod's. --arch: the sidecar has
    no GPU, it is told which repository its pod's Triton serves."""
    args = ["gateway", "--triton", f"127.0.0.1:{PORTS['grpc']}", "--repo", MODELS_MOUNT, "--variant", variant]
    args += ["-c", f"{CONFIG_MOUNT}/lpx.yaml", "--access-log", "-"]  # the access log on stdout: kubectl logs
    args += ["--arch", arch, "--host", "0.0.0.0", "--port", str(PORTS["openai"])]
    return args + ["--keys", f"{KEYS_MOUNT}/keys.json"]


def gateway_container(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    return container(
        "gateway",
        cfg.deploy.slim_image,
        sidecar_args(cfg, variant, arch),
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
            ("config", CONFIG_MOUNT, True),
            ("lpx-home", LPX_HOME, False),
            ("tmp", "/tmp", False),
        ],
    )


# The init container streams lpx-repos.tgz into the models volume: the checksum is taken on the same stream
# (a fifo into sha256sum), the files land in a hidden folder and move into place only when it matches, so
# a corrupt or partial download leaves nothing `lpx serve --repo /models` would pick up. No tarball copy:
# the volume holds the unpacked repositories only. POSIX sh (busybox in the curl image, dash here).
FETCH_SCRIPT = """set -eu
rm -rf /models/.incoming /tmp/repos.fifo
mkdir /models/.incoming
mkfifo /tmp/repos.fifo
sha256sum < /tmp/repos.fifo > /tmp/repos.sha256 &
curl -fsSL --retry 5 "$REPOS_URL" | tee /tmp/repos.fifo | tar -xzf - -C /models/.incoming
wait $!
got=$(cut -d' ' -f1 /tmp/repos.sha256)
if [ "$got" != "$REPOS_SHA256" ]; then
  rm -rf /models/.incoming
  echo "lpx-repos.tgz has sha256 $got, not $REPOS_SHA256 (deploy.repository.sha256): a corrupt download," \
    "or the tarball was replaced - set sha256 from the new lpx-repos.tgz.sha256" >&2
  exit 1
fi
rm -rf /models/artifacts
mv /models/.incoming/* /models/
rmdir /models/.incoming
"""


def quantity_bytes(q: str) -> int:
    """'12Gi' -> bytes (binary and decimal suffixes, as Kubernetes reads them)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", q)
    if not m:
        raise UsageError(f"'{q}' is not a size - write it as Kubernetes does, e.g. 12Gi or 800Mi")
    unit = m.group(2) or ""
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    scale.update({f"{k}i": 1024 ** (i + 1) for i, k in enumerate("KMGT")})
    return int(float(m.group(1)) * scale[unit])


def models_size(cfg: Config) -> str | None:
    """The models emptyDir's limit: the unpacked repositories (deploy.repository.size) + 10 %, in Mi."""
    size = cfg.deploy.repository.size
    if size is None:
        return None
    return f"{-(-quantity_bytes(size) * 11 // 10) // 2**20 + 1}Mi"


def fetch_container(cfg: Config) -> dict[str, Any]:
    """Init container: stream CI's lpx-repos.tgz into the models volume, checking its sha256 on the way."""
    r = cfg.deploy.repository
    resources = {"cpu": "1", "memory": "512Mi", "ephemeral-storage": models_size(cfg)}
    return {
        "name": "fetch-repository",
        "image": FETCH_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", FETCH_SCRIPT],
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


def grace_period(cfg: Config) -> int:
    """serving.openai.drain_timeout_s for the streams, + 30 s for Triton to stop after them."""
    return int(-(-cfg.serving.openai.drain_timeout_s // 1)) + 30


def pod_spec(cfg: Config, variant: str, arch: str, gpus: int, gateway: bool = True) -> dict[str, Any]:
    d = cfg.deploy
    fetch = d.repository.url is not None
    models = (
        {"name": "models", "emptyDir": {"sizeLimit": models_size(cfg)}}
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
        # SIGTERM: the gateway drains its streams (serving.openai.drain_timeout_s), then Triton stops
        "terminationGracePeriodSeconds": grace_period(cfg),
        "containers": [triton_container(cfg, variant, gpus)]
        + ([gateway_container(cfg, variant, arch)] if gateway else []),
        "volumes": [
            models,
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": d.shm_size}},
            {"name": "lpx-home", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
        ]
        + (
            [
                {"name": "keys", "secret": {"secretName": d.keys_secret, "defaultMode": 0o400}},
                {"name": "config", "configMap": {"name": config_map(cfg, variant)["metadata"]["name"]}},
            ]
            if gateway
            else []
        ),
    }
    if fetch:
        spec["initContainers"] = [fetch_container(cfg)]
    return spec


def deployment(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    """No spec.replicas: the arch's HPA owns the count (a re-apply would reset it otherwise)."""
    return resource(
        "apps/v1",
        "Deployment",
        meta(cfg, variant, workload_name(cfg, variant, arch), POD_SKIPS),
        {
            "selector": {"matchLabels": arch_labels(cfg, variant, arch)},
            # one new pod at a time, none removed before it is ready: GPUs are scarce, traffic continuous
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {**labels(cfg, variant), **arch_labels(cfg, variant, arch)}},
                "spec": pod_spec(cfg, variant, arch, cfg.build.ranks),
            },
        },
    )


def leader_worker_set(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    """tp x pp above one node: a group of world / gpus_per_node pods. The leader runs `lpx serve`, whose
    mpirun spans the group (servers/ranks.py derives the hosts from the LWS_* variables the
    LeaderWorkerSet controller sets); workers hold their GPUs and run sshd, non-root, on port 2222 for
    mpirun to start their ranks, with keys from deploy.ssh_secret (mpi.py)."""
    per_node = cfg.deploy.gpus_per_node
    world = cfg.build.ranks
    if world % per_node:
        raise UsageError(
            f"tp_size x pp_size = {world} GPUs do not fill whole nodes of {per_node} - set "
            "deploy.gpus_per_node to a divisor of it"
        )
    pod_labels = {**labels(cfg, variant), **arch_labels(cfg, variant, arch)}
    leader = pod_spec(cfg, variant, arch, per_node)
    worker = pod_spec(cfg, variant, arch, per_node, gateway=False)
    rank = worker["containers"][0]
    rank["command"] = mpi.worker_command()
    rank.pop("args")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        rank.pop(probe)
    rank["ports"] = [{"name": "ssh", "containerPort": mpi.SSH_PORT}]
    ssh = mpi.ssh_volume(cfg.deploy.ssh_secret)
    for spec, c in ((worker, rank), (leader, leader["containers"][0])):
        spec["volumes"].append(ssh)
        c["volumeMounts"].append({"name": "ssh", "mountPath": mpi.SSH_MOUNT, "readOnly": True})
    leader["containers"][0]["env"] += mpi.leader_env()
    rank["readinessProbe"] = {"tcpSocket": {"port": "ssh"}, "periodSeconds": 10}
    rank["livenessProbe"] = {"tcpSocket": {"port": "ssh"}, "periodSeconds": 20}
    return resource(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        meta(cfg, variant, workload_name(cfg, variant, arch), POD_SKIPS),
        {  # no replicas: the HPA owns the group count
            "leaderWorkerTemplate": {
                "size": world // per_node,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": pod_labels}, "spec": leader},
                "workerTemplate": {
                    "metadata": {"labels": {**pod_labels, "app.kubernetes.io/component": "worker"}},
                    "spec": worker,
                },
            },
        },
    )


def workload(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    if is_lws(cfg):
        return leader_worker_set(cfg, variant, arch)
    return deployment(cfg, variant, arch)


def namespace(cfg: Config) -> dict[str, Any]:
    """The namespace, labelled for the `restricted` Pod Security Standard the pods meet."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": cfg.deploy.namespace,
            "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }
