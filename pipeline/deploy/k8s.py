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
from . import images
from .delivery import fetch_container, models_size, quantity_bytes  # noqa: F401 (quantity_bytes: tests)

PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
MODELS_MOUNT = "/models"
KEYS_MOUNT = "/etc/lpx/keys"
CONFIG_MOUNT = "/etc/lpx/config"  # the deployed lpx.yaml: the sidecar's serving.openai settings
CHAT_TEMPLATE = "chat_template.jinja"  # serving.openai.chat_template's text, beside it
LPX_HOME = "/home/lpx/.lpx"
USER_ID = 1000
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
    "CKV_K8S_40": "uid 1000 is the images' own non-root user (triton-server in Triton's base, lpx in the slim ones)",
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


def gpus(cfg: Config) -> int:
    """GPUs one replica holds: tp x pp for the engine target (one Triton rank each) and the vllm target
    (vLLM's own tensor / pipeline workers in the pod), one for torch."""
    b = cfg.build
    return b.tp_size * b.pp_size if b.target in ("engine", "vllm") else b.ranks


def is_lws(cfg: Config) -> bool:
    """tp x pp needs more GPUs than one node has: a LeaderWorkerSet instead of a Deployment."""
    return gpus(cfg) > cfg.deploy.gpus_per_node


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


# vllm target: vLLM (torch.compile artifacts), Triton's kernel JIT, Inductor, FlashInfer and Hugging Face write
# caches under HOME or /tmp by default; the root filesystem is read-only and LPX_HOME's volume is 1 GiB (logs,
# keys, sshd state), so they get a volume of their own, `cache`, sized by deploy.cache_size (the image's
# LPX_VLLM_PYTHON names vLLM's python: Dockerfile.vllm)
CACHE_MOUNT = "/home/lpx/.cache"
VLLM_ENV = {
    "XDG_CACHE_HOME": CACHE_MOUNT,
    "VLLM_CACHE_ROOT": f"{CACHE_MOUNT}/vllm",
    "TRITON_CACHE_DIR": f"{CACHE_MOUNT}/triton",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_MOUNT}/inductor",
}


def triton_container(cfg: Config, variant: str, gpus: int) -> dict[str, Any]:
    d = cfg.deploy
    c = container(
        "triton",
        images.server(cfg),
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
    if cfg.build.target == "vllm":
        c["env"] += [{"name": k, "value": v} for k, v in VLLM_ENV.items()]
        c["volumeMounts"].append({"name": "cache", "mountPath": CACHE_MOUNT})
    return c


def _pod_paths(deployed: Config) -> None:
    """The paths of this machine out of the deployed lpx.yaml: the pod has none of them (and they would tell
    the cluster this machine's folders). The checkpoint's place in the pod is the repositories' mount, where
    the sidecar reads the tokenizer; calibration and evaluation data are the build's; the keys file and the
    access log are the pod's own (sidecar_args)."""
    deployed.model.checkpoint = Path(MODELS_MOUNT)
    deployed.model.tokenizer = None
    deployed.calibration.data = None
    deployed.evaluation.data = None
    deployed.serving.openai.api_keys_file = None
    deployed.serving.openai.access_log = None


def config_map(cfg: Config, variant: str) -> dict[str, Any]:
    """The deployed lpx.yaml (values that differ from LPX's defaults), mounted into the gateway sidecar: its
    serving.openai section is what the sidecar runs with, the same settings model `lpx serve` uses."""
    from ..config import dump_config

    deployed, files = cfg.model_copy(deep=True), {}
    _pod_paths(deployed)
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
        images.slim(cfg),
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
        + ([{"name": "cache", "emptyDir": {"sizeLimit": d.cache_size}}] if cfg.build.target == "vllm" else [])
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
        spec["initContainers"] = [fetch_container(cfg, _security())]
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
                "spec": pod_spec(cfg, variant, arch, gpus(cfg)),
            },
        },
    )


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
