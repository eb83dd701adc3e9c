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
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.0.2"  # Dynamo 1.0.2's own examples
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
        "command": ["python3", "-m", "dynamo.trtllm"],
        "args": args,
        "volumeMounts": [
            {"name": "models", "mountPath": k8s.MODELS_MOUNT, "readOnly": True},
            {"name": "engine-args", "mountPath": ENGINE_MOUNT, "readOnly": True},
        ],
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
            "podTemplate": {"spec": {"containers": [{"name": "main", "image": image}]}},
        }
    ]
    for phase in phases:
        main = _main_container(cfg, phase, path, image)
        main["resources"] = {
            "limits": {"nvidia.com/gpu": _gpus(cfg), "cpu": cfg.deploy.cpu, "memory": cfg.deploy.memory}
        }
        components.append(
            {
                "name": phase,
                "type": phase,
                "replicas": cfg.deploy.replicas,
                "podTemplate": {"spec": {"containers": [main], "volumes": _volumes(cfg, variant)}},
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
            "extraPodSpec": {"mainContainer": {"image": image}},
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
        service["extraPodSpec"] = {"mainContainer": main, "volumes": _volumes(cfg, variant)}
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
    api_version: str = "v1alpha1",
) -> list[dict[str, Any]]:
    """[ConfigMap with the engine args, DynamoGraphDeployment]. v1alpha1 by default: every released
    operator (up to 1.0.2) serves only it; v1beta1 (`spec.components`) is served from Dynamo's main."""
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
        },
        "spec": API_VERSIONS[api_version](cfg, variant, phases, path, image),
    }
    return [config_map, graph]


def local_commands(cfg: Config, variant: str, engine_dir: Path, checkpoint: str | None = None) -> list[str]:
    """The two commands that serve the same thing on one machine (Dynamo installed; etcd/NATS as its
    docs say)."""
    if checkpoint is None:
        try:
            checkpoint = str(home() / checkpoint_path(cfg, variant))
        except NotFound:
            checkpoint = "<the llmapi checkpoint folder>"
    path = checkpoint
    return [
        "python3 -m dynamo.frontend --http-port 8000",
        f"python3 -m dynamo.trtllm --model-path {path} --served-model-name {cfg.model.name} "
        f"--extra-engine-args {engine_dir / 'worker.yaml'}",
    ]
