"""lpx.yaml's `deploy` section: the Kubernetes and Dynamo manifests `lpx deploy` writes (docs/deploy.md)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from ..facts.images import DOCKERFILE_BASE
from .base import GPUS, INT32_MAX, MAX_GPUS, Strict, bounded

REPLICAS = "Kubernetes' replica counts are int32"
# a registry host (a dot or a port, or localhost) and an optional path; an image reference name:tag
REGISTRY = r"^(localhost|[a-z0-9-]+(\.[a-z0-9-]+)+|[a-z0-9.-]+:[0-9]+)(:[0-9]+)?(/[a-z0-9._-]+)*$"
IMAGE = r"^[a-z0-9.:/_-]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"


class Autoscaling(Strict):
    min_replicas: int = bounded(1, ge=1, le=INT32_MAX, limit=REPLICAS)
    max_replicas: int = bounded(4, ge=1, le=INT32_MAX, limit=REPLICAS)
    queue_compute_ratio: float = Field(
        1.0,
        gt=0,
        description="HPA target: Triton's queue time over compute time per pod (NVIDIA's Kubernetes tutorial's "
        "metric); above it, pods are added.",
    )


class Repository(Strict):
    pvc: str | None = Field(
        None,
        description="PersistentVolumeClaim holding the packaged repositories, mounted read-only "
        "(default: lpx-models, unless url is set).",
    )
    url: str | None = Field(
        None,
        description="Object-store URL of CI's lpx-repos.tgz (scripts/ci/package.sh), fetched by an init "
        "container instead of a PVC.",
    )
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="Checksum the fetched tarball must have."
    )
    size: str | None = Field(
        None,
        pattern=r"^[0-9]+(\.[0-9]+)?([KMGT]i?)?$",
        description="Unpacked size of lpx-repos.tgz (e.g. 14Gi; `tar -tvzf lpx-repos.tgz | awk '{s+=$3} END "
        "{print s}'` prints it in bytes): the models volume's sizeLimit (+10%) and the pod's "
        "ephemeral-storage request.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Repository:
        if self.pvc and self.url:
            raise ValueError("set pvc or url, not both")
        if self.url and not self.sha256:
            raise ValueError("url needs sha256 (the tarball's checksum, printed by scripts/ci/package.sh)")
        if self.url and not self.size:
            raise ValueError(
                "url needs size (the unpacked size of lpx-repos.tgz, e.g. 14Gi): the pod's volume is sized "
                "and its disk requested from it, so a node without room refuses it instead of evicting it"
            )
        return self


class Deploy(Strict):
    """`lpx deploy`: Kubernetes and Dynamo manifests (written, validated offline; applying them is yours)."""

    namespace: str = Field("lpx", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    registry: str = Field(
        "localhost:5000",
        description="Registry (host[:port][/path]) of LPX's own images, prefixed to image, slim_image and "
        "vllm_image unless they name a registry themselves. The default is a local registry (kind, k3d, "
        "minikube's registry addon); set yours, or `lpx deploy --registry`. Each overlay's kustomization "
        "lists the images (kustomize `images:`) to override per overlay.",
    )
    image: str = Field(
        "lpx-trtllm:0.1.0",
        description="Image serving the engine target: the Dockerfile (Triton TensorRT-LLM base).",
    )
    image_base: str = Field(
        DOCKERFILE_BASE,
        description="The BASE_IMAGE `image` was built on (docker build --build-arg BASE_IMAGE=...; default: "
        "the Dockerfile's). lpx deploy k8s refuses an engine whose build.trtllm_version differs from the "
        "TensorRT-LLM line this image ships (pipeline/facts/images.py).",
    )
    slim_image: str = Field(
        "lpx-slim:0.1.0",
        description="Image of the gateway and the torch target: Dockerfile.slim.",
    )
    vllm_image: str = Field(
        "lpx-vllm:0.1.0",
        description="Image serving the vllm target: Dockerfile.vllm (LPX's slim image + vLLM's own environment).",
    )
    replicas: int = bounded(
        1,
        ge=1,
        le=INT32_MAX,
        limit=REPLICAS,
        description="NVIDIA Dynamo's worker count (lpx deploy dynamo). On Kubernetes the HPA owns the count "
        "(autoscaling.min_replicas .. max_replicas); lpx deploy k8s refuses another value here.",
    )
    gpus_per_node: int = bounded(
        8,
        ge=1,
        le=MAX_GPUS,
        limit=GPUS,
        description="GPUs one node has; more per replica needs a LeaderWorkerSet.",
    )
    cpu: str = Field("8", description="CPU request = limit of the serving container.")
    memory: str = Field("64Gi", description="Memory request = limit of the serving container.")
    shm_size: str = Field("4Gi", description="/dev/shm (Triton's python backend exchanges tensors there).")
    cache_size: str = Field(
        "10Gi",
        pattern=r"^[0-9]+(\.[0-9]+)?([KMGT]i?)?$",
        description="vllm target: the emptyDir for vLLM's, torch.compile's, Triton's kernel and FlashInfer's "
        "caches (XDG_CACHE_HOME, VLLM_CACHE_ROOT, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR).",
    )
    keys_secret: str = Field("lpx-gateway-keys", description="Secret holding the gateway's keys.json.")
    ssh_secret: str = Field(
        "lpx-mpi-ssh",
        description="Multi-node (LeaderWorkerSet): Secret with host_key, authorized_keys, id_ed25519 and "
        "known_hosts for mpirun's ssh to the workers' sshd (docs/deploy.md).",
    )
    monitoring_namespace: str = Field("monitoring", description="Where Prometheus runs (allowed to scrape).")
    prometheus_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"},
        description="Labels on the ServiceMonitor and PrometheusRule that your Prometheus selects them by "
        "(kube-prometheus-stack: release: <its Helm release name>).",
    )
    repository: Repository = Field(default_factory=Repository)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str) -> str:
        if not re.fullmatch(REGISTRY, value):
            raise ValueError(
                f"{value!r} is not a registry: write host[:port][/path] without a scheme, e.g. ghcr.io/my-org "
                "or localhost:5000"
            )
        return value

    @field_validator("image", "image_base", "slim_image", "vllm_image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not re.fullmatch(IMAGE, value):
            raise ValueError(
                f"{value!r} is not an image reference: write [registry/]name[:tag][@sha256:digest] in "
                "lowercase, e.g. lpx-slim:0.1.0 or ghcr.io/my-org/lpx-slim:0.1.0"
            )
        return value

    @model_validator(mode="after")
    def _replicas(self) -> Deploy:
        if self.autoscaling.max_replicas < self.autoscaling.min_replicas:
            raise ValueError("autoscaling: max_replicas is below min_replicas")
        return self
