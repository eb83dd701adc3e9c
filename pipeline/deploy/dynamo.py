"""NVIDIA Dynamo for the llmapi target: a DynamoGraphDeployment (nvidia.com/v1alpha1 `spec.services`, or
v1beta1 `spec.components`)
whose TensorRT-LLM workers serve LPX's unified HF checkpoint with LPX's checked LLM-API options.

Facts (tests/contracts/crds/ pins the CRD; docs/deploy.md has the sources): Dynamo's TensorRT-LLM worker
runs the PyTorch backend only, from a checkpoint folder (`--model-path`) and an LLM-API YAML
(`--extra-engine-args`), never a trtllm-build engine or a Triton repository; it passes those arguments
through unchecked, so LPX writes only options it checks (stages/build/llmapi.py, the contract in
tests/contracts/trtllm_llmapi_options.json). Disaggregated serving adds `cache_transceiver_config` to both
phases, `disable_overlap_scheduler: true` to prefill workers, and `--disaggregation-mode prefill|decode`.

The options go into a ConfigMap mounted at /etc/lpx/engine; the checkpoint is read from the model
repositories (a PVC or CI's tarball, as for Kubernetes) under the path the llmapi repository has in
LPX_HOME, so the same lpx-repos.tgz feeds both deployments.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ..artifacts import KINDS, home, read_manifest
from ..config import Config
from ..errors import NotFound, UsageError
from ..stages.build.llmapi import llmapi_options
from . import k8s

ENGINE_MOUNT = "/etc/lpx/engine"
# Dynamo v1.5.0 (GA 2026-09-18; tests/contracts/dynamo_release.json has the sources): v1beta1 is the CRD
# storage version, v1alpha1 deprecated (still served, converted by the operator's webhook)
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.5.0"
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
}
PHASES = {"agg": ["worker"], "disagg": ["prefill", "decode"]}


def engine_args(cfg: Config, variant: str, phase: str) -> dict[str, Any]:
    """The LLM-API options of one phase: LPX's for the variant, plus what disaggregation needs."""
    options = copy.deepcopy(llmapi_options(cfg, cfg.variant(variant)))
    if phase in ("prefill", "decode"):
        options["cache_transceiver_config"] = {"backend": "DEFAULT"}
        # Dynamo's examples: the overlap scheduler is not supported in prefill-only workers
        options["disable_overlap_scheduler"] = phase == "prefill"
    return options


def checkpoint_path(cfg: Config, variant: str) -> str:
    """The llmapi checkpoint's path relative to LPX_HOME (the same inside CI's lpx-repos.tgz): the newest
    complete repository of the variant."""
    folder = home() / "artifacts" / KINDS["repo"] / cfg.model.name / variant
    found = []
    for manifest in folder.glob("*/*/manifest.json"):
        m = read_manifest(manifest.parent)
        if m is not None and (manifest.parent / "tensorrt_llm" / "1" / "engine" / "checkpoint").is_dir():
            found.append((m.get("created", 0), manifest.parent))
    if not found:
        raise NotFound(
            f"No llmapi repository of variant '{variant}' under {folder} - run 'lpx repo -c lpx.yaml "
            f"--variant {variant}' first (or pass --model-path with the checkpoint's path in the volume)"
        )
    repo = max(found)[1]
    return str((repo / "tensorrt_llm" / "1" / "engine" / "checkpoint").relative_to(home()))


def _main_container(cfg: Config, phase: str, model_path: str, image: str) -> dict[str, Any]:
    args = [
        "--model-path",
        model_path,
        "--served-model-name",
        cfg.model.name,
        "--extra-engine-args",
        f"{ENGINE_MOUNT}/{phase}.yaml",
    ]
    if phase != "worker":
        args += ["--disaggregation-mode", phase]
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "securityContext": SECURITY,
        "command": ["python3", "-m", "dynamo.trtllm"],
        "args": args,
        "volumeMounts": [
            {"name": "models", "mountPath": k8s.MODELS_MOUNT, "readOnly": True},
            {"name": "engine-args", "mountPath": ENGINE_MOUNT, "readOnly": True},
        ],
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
    return [
        {"name": "models", "persistentVolumeClaim": {"claimName": r.pvc or "lpx-models", "readOnly": True}},
        {"name": "engine-args", "configMap": {"name": _config_map_name(cfg, variant)}},
    ]


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
                    "automountServiceAccountToken": False,
                    "securityContext": POD_SECURITY,
                    "containers": [_frontend(image)],
                }
            },
        }
    ]
    for phase in phases:
        main = _main_container(cfg, phase, path, image)
        limits = {"nvidia.com/gpu": _gpus(cfg), "cpu": cfg.deploy.cpu, "memory": cfg.deploy.memory}
        main["resources"] = {"requests": dict(limits), "limits": limits}
        components.append(
            {
                "name": phase,
                "type": phase,
                "replicas": cfg.deploy.replicas,
                "podTemplate": {
                    "spec": {
                        "automountServiceAccountToken": False,
                        "securityContext": POD_SECURITY,
                        "containers": [main],
                        "volumes": _volumes(cfg, variant),
                    }
                },
            }
        )
    return {"backendFramework": "trtllm", "components": components}


def spec_v1alpha1(cfg: Config, variant: str, phases: list[str], path: str, image: str) -> dict[str, Any]:
    """`spec.services`: a map; workers are componentType worker (+ subComponentType prefill/decode), the
    container is extraPodSpec.mainContainer, GPUs are resources.limits.gpu (what released operators,
    v1.0.2, serve)."""
    services: dict[str, Any] = {
        "Frontend": {
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {"securityContext": POD_SECURITY, "mainContainer": _frontend(image)},
        }
    }
    names = {"worker": "TRTLLMWorker", "prefill": "TRTLLMPrefillWorker", "decode": "TRTLLMDecodeWorker"}
    for phase in phases:
        main = _main_container(cfg, phase, path, image)
        main.pop("name")
        service: dict[str, Any] = {"componentType": "worker", "replicas": cfg.deploy.replicas}
        if phase != "worker":
            service["subComponentType"] = phase
        service["resources"] = {
            "limits": {"gpu": _gpus(cfg), "cpu": cfg.deploy.cpu, "memory": cfg.deploy.memory}
        }
        service["extraPodSpec"] = {
            "securityContext": POD_SECURITY,
            "mainContainer": main,
            "volumes": _volumes(cfg, variant),
        }
        services[names[phase]] = service
    return {"backendFramework": "trtllm", "services": services}


def _config_map_name(cfg: Config, variant: str) -> str:
    return k8s.dns_name(k8s.app_name(cfg, variant), "engine-args")


API_VERSIONS = {"v1alpha1": spec_v1alpha1, "v1beta1": spec_v1beta1}


def dynamo_objects(
    cfg: Config,
    variant: str,
    disagg: bool = False,
    model_path: str | None = None,
    image: str = DYNAMO_IMAGE,
    api_version: str = DEFAULT_API_VERSION,
) -> list[dict[str, Any]]:
    """[Namespace, ConfigMap with the engine args, DynamoGraphDeployment]. v1beta1 by default (served
    from Dynamo 1.2.0, the storage version from 1.5.0); v1alpha1 (`spec.services`) for operators before
    1.2.0."""
    cfg.variant(variant)  # a clear error for an unknown name
    if cfg.build.target != "llmapi":
        raise UsageError(
            f"'lpx deploy dynamo' serves the llmapi target (a unified HF checkpoint); this config builds "
            f"'{cfg.build.target}' - set build.target: llmapi, or use 'lpx deploy k8s'"
        )
    if api_version not in API_VERSIONS:
        raise UsageError(
            f"DynamoGraphDeployment version {api_version!r}: use one of {', '.join(API_VERSIONS)}"
        )
    phases = PHASES["disagg" if disagg else "agg"]
    path = model_path or f"{k8s.MODELS_MOUNT}/{checkpoint_path(cfg, variant)}"
    import yaml

    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": _config_map_name(cfg, variant),
            "namespace": cfg.deploy.namespace,
            "labels": k8s.labels(cfg, variant),
        },
        "data": {f"{p}.yaml": yaml.safe_dump(engine_args(cfg, variant, p), sort_keys=False) for p in phases},
    }
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
        "spec": API_VERSIONS[api_version](cfg, variant, phases, path, image),
    }
    return [k8s.namespace(cfg), config_map, graph]


def local_commands(cfg: Config, variant: str, engine_dir: Path, checkpoint: str | None = None) -> list[str]:
    """The two commands that serve the same thing on one machine (Dynamo installed). No etcd or NATS:
    a file key-value store and the TCP request plane (flags of Dynamo's components since 1.x)."""
    if checkpoint is None:
        try:
            checkpoint = str(home() / checkpoint_path(cfg, variant))
        except NotFound:
            checkpoint = "<the llmapi checkpoint folder>"
    path = checkpoint
    return [
        "python3 -m dynamo.frontend --http-port 8000 --store-kv file --request-plane tcp",
        f"python3 -m dynamo.trtllm --model-path {path} --served-model-name {cfg.model.name} "
        f"--extra-engine-args {engine_dir / 'worker.yaml'} --store-kv file --request-plane tcp",
    ]
