"""NVIDIA Dynamo for the llmapi and vllm targets: a DynamoGraphDeployment (nvidia.com/v1beta1
`spec.components` by default, v1alpha1 `spec.services` for older operators) whose workers serve LPX's
unified HF checkpoint with LPX's checked engine options.

Facts (tests/contracts/ pins the CRD, the release and the components' flags; docs/deploy.md has the
sources):
- llmapi: Dynamo's TensorRT-LLM worker (`python3 -m dynamo.trtllm`, image tensorrtllm-runtime) runs the
  PyTorch backend only, from a checkpoint folder (`--model-path`) and an LLM-API YAML
  (`--extra-engine-args`), which it passes through unchecked, so LPX writes only options it checks
  (stages/build/llmapi.py, tests/contracts/trtllm_llmapi_options.json). Disaggregated serving adds
  `cache_transceiver_config` to both phases, `disable_overlap_scheduler: true` to prefill workers, and
  `--disaggregation-mode prefill|decode`. The options go into a ConfigMap mounted at /etc/lpx/engine.
- vllm: Dynamo's vLLM worker (`python3 -m dynamo.vllm`, image vllm-runtime) takes vLLM's engine
  arguments as flags (`--model`, `--max-model-len` ...): those of the variant's vllm build
  (lpx_vllm.json's engine_args + gpu_engine_args, names checked against vLLM's EngineArgs). Disaggregated:
  `--disaggregation-mode prefill|decode` and NIXL for the KV transfer, as Dynamo's examples.
The checkpoint is read from the model repositories (a PVC) under the path the repository has in LPX_HOME,
so the same lpx-repos.tgz feeds Kubernetes and Dynamo.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

from ..artifacts import KINDS, home, read_manifest
from ..config import Config
from ..errors import NotFound, UsageError
from ..stages.build.llmapi import llmapi_options
from . import dynamo_vllm, k8s

ENGINE_MOUNT = "/etc/lpx/engine"
# Dynamo v1.6.1 (v1.6.0 GA 2026-10-21; tests/contracts/dynamo_release.json has the sources): the release whose
# runtime LPX's tests run from PyPI (constraints/dynamo.txt), so the images the pods name are the runtime whose
# own parsers took LPX's flags. v1beta1 is the CRD storage version (from 1.5.0), v1alpha1 deprecated (still
# served, converted by the operator's webhook)
DYNAMO_RELEASE = "1.6.1"
IMAGES = {
    "llmapi": f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_RELEASE}",
    "vllm": f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DYNAMO_RELEASE}",
}
DYNAMO_IMAGE = IMAGES["llmapi"]
BACKENDS = {"llmapi": "trtllm", "vllm": "vllm"}  # build.target -> spec.backendFramework / dynamo.<module>
DEFAULT_API_VERSION = "v1beta1"
# checkov checks that do not apply to Dynamo's pods (written into the graph's checkov.io/skip annotations)
SKIPS = {
    "CKV_K8S_8": "the Dynamo operator injects liveness probes into the main container (system port /live)",
    "CKV_K8S_9": "the Dynamo operator injects readiness probes into the main container (/health)",
    "CKV_K8S_22": "Dynamo's runtime writes caches in its workspace; a read-only root is not supported upstream",
    "CKV_K8S_43": "the runtime image is pinned by release tag; pin its digest in an overlay if your policy asks",
    "CKV_K8S_40": "uid 1000 is the runtime image's own non-root user",
    "CKV_K8S_35": "no secrets are used by these pods",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent: GPU nodes cache multi-GB runtime images; tags are immutable",
    "CKV2_K8S_6": "the operator wires frontend and workers on ports it assigns (TCP request plane); scope it there",
    "CKV_K8S_38": "Dynamo's Kubernetes discovery reads the pod's service account token (the operator's "
    "<graph>-k8s-service-discovery account; tests/contracts/dynamo_operator.json)",
}
# The operator (Kubernetes discovery, its default backend) gives every pod of the graph the service account
# <graph>-k8s-service-discovery, whose Role lets the runtime create the DynamoWorkerMetadata objects through
# which frontend and workers find each other; the runtime's Kubernetes client reads that account's token from
# the pod (kube-rs in-cluster config). The operator sets the account only where the pod template names none,
# and never the token's mount: LPX names no account and mounts the token explicitly (a pod without it fails at
# start with "Failed to create Kubernetes client"). tests/contracts/dynamo_operator.json has the sources.
DISCOVERY_POD = {"automountServiceAccountToken": True}
PHASES = {"agg": ["worker"], "disagg": ["prefill", "decode"]}


def engine_args(cfg: Config, variant: str, phase: str) -> dict[str, Any]:
    """The LLM-API options of one phase: LPX's for the variant, plus what disaggregation needs."""
    options = copy.deepcopy(llmapi_options(cfg, cfg.variant(variant)))
    if phase in ("prefill", "decode"):
        options["cache_transceiver_config"] = {"backend": "DEFAULT"}
        # Dynamo's examples: the overlap scheduler is not supported in prefill-only workers
        options["disable_overlap_scheduler"] = phase == "prefill"
    return options


def repository(cfg: Config, variant: str) -> Path:
    """The newest complete repository of the variant with a checkpoint folder (llmapi, vllm)."""
    folder = home() / "artifacts" / KINDS["repo"] / cfg.model.name / variant
    found = []
    for manifest in folder.glob("*/*/manifest.json"):
        m = read_manifest(manifest.parent)
        engine = manifest.parent / "tensorrt_llm" / "1" / "engine"
        # a vllm repository has lpx_vllm.json beside the checkpoint, an llmapi one has not
        if (
            m is not None
            and (engine / "checkpoint").is_dir()
            and ((engine / dynamo_vllm.MODEL_FILE).is_file() == (cfg.build.target == "vllm"))
        ):
            found.append((m.get("created", 0), manifest.parent))
    if not found:
        hint = (
            "; Dynamo's vLLM worker takes the build's engine arguments (lpx_vllm.json there) as flags, so the "
            "repository is needed even with --model-path"
            if cfg.build.target == "vllm"
            else " (or pass --model-path with the checkpoint's path in the volume)"
        )
        raise NotFound(
            f"No {cfg.build.target} repository of variant '{variant}' under {folder} - run 'lpx repo -c "
            f"lpx.yaml --variant {variant}' first{hint}"
        )
    return max(found)[1]


def vllm_engine_args(cfg: Config, variant: str) -> dict[str, Any]:
    """The vllm build's engine arguments, from the variant's newest repository (lpx_vllm.json)."""
    engine = repository(cfg, variant) / "tensorrt_llm" / "1" / "engine"
    return dynamo_vllm.engine_args(engine)


def checkpoint_path(cfg: Config, variant: str) -> str:
    """The checkpoint's path relative to LPX_HOME (the same inside CI's lpx-repos.tgz)."""
    repo = repository(cfg, variant)
    return str((repo / "tensorrt_llm" / "1" / "engine" / "checkpoint").relative_to(home()))


def worker_args(cfg: Config, variant: str, phase: str, model_path: str) -> list[str]:
    """The worker's arguments (after `python3 -m dynamo.<backend>`)."""
    if cfg.build.target == "vllm":
        return dynamo_vllm.worker_args(cfg, phase, model_path, vllm_engine_args(cfg, variant))
    args = ["--model-path", model_path, "--served-model-name", cfg.model.name]
    args += ["--extra-engine-args", f"{ENGINE_MOUNT}/{phase}.yaml"]
    return args + (["--disaggregation-mode", phase] if phase != "worker" else [])


def _main_container(cfg: Config, variant: str, phase: str, model_path: str, image: str) -> dict[str, Any]:
    mounts = [{"name": "models", "mountPath": k8s.MODELS_MOUNT, "readOnly": True}]
    if cfg.build.target == "llmapi":
        mounts.append({"name": "engine-args", "mountPath": ENGINE_MOUNT, "readOnly": True})
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "securityContext": SECURITY,
        "command": ["python3", "-m", f"dynamo.{BACKENDS[cfg.build.target]}"],
        "args": worker_args(cfg, variant, phase, model_path),
        "volumeMounts": mounts,
    }


SECURITY = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "runAsUser": k8s.USER_ID,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY = {"runAsNonRoot": True, "fsGroup": k8s.USER_ID, "seccompProfile": {"type": "RuntimeDefault"}}


def _frontend(image: str) -> dict[str, Any]:
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "securityContext": SECURITY,
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    }


def _volumes(cfg: Config, variant: str) -> list[dict[str, Any]]:
    r = cfg.deploy.repository
    if r.url:
        raise UsageError(
            "deploy dynamo reads the checkpoint from a PVC: set deploy.repository.pvc (Dynamo's pods have "
            "no LPX init container to fetch deploy.repository.url)"
        )
    volumes = [
        {"name": "models", "persistentVolumeClaim": {"claimName": r.pvc or "lpx-models", "readOnly": True}}
    ]
    if cfg.build.target == "llmapi":
        volumes.append({"name": "engine-args", "configMap": {"name": _config_map_name(cfg, variant)}})
    return volumes


def _gpus(cfg: Config) -> str:
    return str(cfg.build.tp_size * cfg.build.pp_size)


def spec_v1beta1(cfg: Config, variant: str, phases: list[str], path: str, image: str) -> dict[str, Any]:
    """`spec.components`: a list; GPUs as nvidia.com/gpu on the `main` container."""
    components = [
        {
            "name": "Frontend",
            "type": "frontend",
            "replicas": 1,
            "podTemplate": {
                "spec": {
                    **DISCOVERY_POD,
                    "securityContext": POD_SECURITY,
                    "containers": [_frontend(image)],
                }
            },
        }
    ]
    for phase in phases:
        main = _main_container(cfg, variant, phase, path, image)
        limits = {"nvidia.com/gpu": _gpus(cfg), "cpu": cfg.deploy.cpu, "memory": cfg.deploy.memory}
        main["resources"] = {"requests": dict(limits), "limits": limits}
        components.append(
            {
                "name": phase,
                "type": phase,
                "replicas": cfg.deploy.replicas,
                "podTemplate": {
                    "spec": {
                        **DISCOVERY_POD,
                        "securityContext": POD_SECURITY,
                        "containers": [main],
                        "volumes": _volumes(cfg, variant),
                    }
                },
            }
        )
    return {"backendFramework": BACKENDS[cfg.build.target], "components": components}


def spec_v1alpha1(cfg: Config, variant: str, phases: list[str], path: str, image: str) -> dict[str, Any]:
    """`spec.services`: a map; workers are componentType worker (+ subComponentType prefill/decode), the
    container is extraPodSpec.mainContainer, GPUs are resources.limits.gpu (what released operators,
    v1.0.2, serve)."""
    services: dict[str, Any] = {
        "Frontend": {
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {
                **DISCOVERY_POD,
                "securityContext": POD_SECURITY,
                "mainContainer": _frontend(image),
            },
        }
    }
    prefix = "TRTLLM" if cfg.build.target == "llmapi" else "Vllm"
    names = {
        p: f"{prefix}{p.title() if p != 'worker' else ''}Worker" for p in ("worker", "prefill", "decode")
    }
    for phase in phases:
        main = _main_container(cfg, variant, phase, path, image)
        main.pop("name")
        service: dict[str, Any] = {"componentType": "worker", "replicas": cfg.deploy.replicas}
        if phase != "worker":
            service["subComponentType"] = phase
        service["resources"] = {
            "limits": {"gpu": _gpus(cfg), "cpu": cfg.deploy.cpu, "memory": cfg.deploy.memory}
        }
        service["extraPodSpec"] = {
            **DISCOVERY_POD,
            "securityContext": POD_SECURITY,
            "mainContainer": main,
            "volumes": _volumes(cfg, variant),
        }
        services[names[phase]] = service
    return {"backendFramework": BACKENDS[cfg.build.target], "services": services}


def _config_map_name(cfg: Config, variant: str) -> str:
    return k8s.dns_name(k8s.app_name(cfg, variant), "engine-args")


API_VERSIONS = {"v1alpha1": spec_v1alpha1, "v1beta1": spec_v1beta1}


def dynamo_objects(
    cfg: Config,
    variant: str,
    disagg: bool = False,
    model_path: str | None = None,
    image: str | None = None,
    api_version: str = DEFAULT_API_VERSION,
) -> list[dict[str, Any]]:
    """[Namespace, (llmapi: the ConfigMap with the engine args,) DynamoGraphDeployment]. v1beta1 by default
    (served from Dynamo 1.2.0, the storage version from 1.5.0); v1alpha1 (`spec.services`) for operators
    before 1.2.0. image: Dynamo's runtime for the target (IMAGES) unless given."""
    cfg.variant(variant)  # a clear error for an unknown name
    if cfg.build.target not in BACKENDS:
        raise UsageError(
            f"'lpx deploy dynamo' serves the llmapi and vllm targets (a unified HF checkpoint); this config "
            f"builds '{cfg.build.target}' - set build.target: llmapi or vllm, or use 'lpx deploy k8s'"
        )
    if api_version not in API_VERSIONS:
        raise UsageError(
            f"DynamoGraphDeployment version {api_version!r}: use one of {', '.join(API_VERSIONS)}"
        )
    phases = PHASES["disagg" if disagg else "agg"]
    path = model_path or f"{k8s.MODELS_MOUNT}/{checkpoint_path(cfg, variant)}"
    graph = {
        "apiVersion": f"nvidia.com/{api_version}",
        "kind": "DynamoGraphDeployment",
        "metadata": {
            "name": k8s.app_name(cfg, variant),
            "namespace": cfg.deploy.namespace,
            "labels": k8s.labels(cfg, variant),
            "annotations": {
                f"checkov.io/skip{i + 1}": f"{c}={why}" for i, (c, why) in enumerate(SKIPS.items())
            },
        },
        "spec": API_VERSIONS[api_version](cfg, variant, phases, path, image or IMAGES[cfg.build.target]),
    }
    if cfg.build.target == "vllm":
        return [k8s.namespace(cfg), graph]
    return [k8s.namespace(cfg), engine_config_map(cfg, variant, phases), graph]


def engine_config_map(cfg: Config, variant: str, phases: list[str]) -> dict[str, Any]:
    """llmapi: each phase's LLM-API YAML (`--extra-engine-args`)."""
    import yaml

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": _config_map_name(cfg, variant),
            "namespace": cfg.deploy.namespace,
            "labels": k8s.labels(cfg, variant),
        },
        "data": {f"{p}.yaml": yaml.safe_dump(engine_args(cfg, variant, p), sort_keys=False) for p in phases},
    }


# One machine without etcd or NATS: discovery through the file system (`--discovery-backend file`) and the
# TCP request plane, flags of both components (tests/contracts/dynamo_cli.json)
LOCAL = ["--discovery-backend", "file", "--request-plane", "tcp"]


def local_commands(cfg: Config, variant: str, engine_dir: Path, checkpoint: str | None = None) -> list[str]:
    """The two commands that serve the same thing on one machine (Dynamo installed)."""
    if checkpoint is None:
        try:
            checkpoint = str(home() / checkpoint_path(cfg, variant))
        except NotFound:
            checkpoint = f"<the {cfg.build.target} checkpoint folder>"
    module = f"dynamo.{BACKENDS[cfg.build.target]}"
    worker = ["python3", "-m", module, *worker_args(cfg, variant, "worker", checkpoint)]
    if "--extra-engine-args" in worker:  # llmapi: the YAML written beside the manifests
        worker[worker.index("--extra-engine-args") + 1] = str(engine_dir / "worker.yaml")
    return [
        shlex.join(["python3", "-m", "dynamo.frontend", "--http-port", "8000", *LOCAL]),
        shlex.join(worker + LOCAL),
    ]
