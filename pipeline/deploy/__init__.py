"""`lpx deploy`: hand a variant over to the systems that scale it. Manifests are data, validated offline.

  k8s.py      the pods: Deployment, containers, probes, volumes, GPU affinity
  lws.py      a LeaderWorkerSet when tp x pp spans nodes (mpi.py: the workers' sshd, the leader's mpirun)
  delivery.py the repositories into the pod: CI's tarball streamed by an init container, or a PVC
  cluster.py  around them: Services, PDB, NetworkPolicy, ServiceMonitor, PrometheusRule, HPA
  dynamo.py   NVIDIA Dynamo's DynamoGraphDeployment (aggregated or disaggregated) for the llmapi and
              vllm targets (Dynamo's TensorRT-LLM or vLLM worker)
  images.py   every image fully qualified: upstream ones as published, LPX's under deploy.registry
  write.py    the kustomize tree on disk, written atomically

No cluster, image registry or container daemon exists where LPX is developed: what is generated here is
checked against pinned schemas (tests/test_deploy.py), never applied. Applying it is the user's step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import UsageError
from . import cluster, dynamo, images, k8s, lws
from .write import file_name, kustomization, write_tree


def _hold(refusal: str | None, warning: str | None) -> None:
    """A refusal from images.*_line_refusal stops `lpx deploy` (exit 2); a warning is printed."""
    if refusal:
        raise UsageError(refusal)
    if warning:
        from ..progress import Reporter

        Reporter().warn(warning)


def workload(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    """One arch's Deployment, or its LeaderWorkerSet when tp x pp spans nodes."""
    if k8s.is_lws(cfg):
        return lws.leader_worker_set(cfg, variant, arch)
    return k8s.deployment(cfg, variant, arch)


def k8s_files(cfg: Config, variant: str) -> dict[str, dict[str, Any]]:
    """Relative path -> object, for the base and one overlay per arch in build.archs (as `variant` builds:
    its own build target where it sets one)."""
    cfg = cfg.for_variant(cfg.variant(variant))  # and a clear error for an unknown name
    if cfg.build.target == "llmapi":
        raise UsageError(
            "build.target llmapi is served by NVIDIA Dynamo's TensorRT-LLM worker, not Triton - use "
            "'lpx deploy dynamo' (or build.target engine / torch / vllm for Kubernetes with Triton)"
        )
    _hold(*images.engine_line_refusal(cfg))  # the engine loads only in the line it was built by
    base = [k8s.namespace(cfg), *cluster.base_objects(cfg, variant)]
    files: dict[str, dict[str, Any]] = {f"base/{file_name(o)}": o for o in base}
    files["base/kustomization.yaml"] = kustomization(
        [file_name(o) for o in base], namespace=cfg.deploy.namespace
    )
    for arch in cfg.build.archs:
        objects = [workload(cfg, variant, arch), *cluster.per_arch_objects(cfg, variant, arch)]
        for o in objects:
            files[f"overlays/{arch}/{file_name(o)}"] = o
        files[f"overlays/{arch}/kustomization.yaml"] = kustomization(
            ["../../base", *(file_name(o) for o in objects)],
            namespace=cfg.deploy.namespace,
            images=images.kustomize_images(images.of(objects)),
        )
    return files


def deploy_k8s(cfg: Config, variant: str, out: Path) -> list[Path]:
    return write_tree(out, k8s_files(cfg, variant))


def deploy_dynamo(
    cfg: Config,
    variant: str,
    out: Path,
    disagg: bool = False,
    model_path: str | None = None,
    api_version: str = dynamo.DEFAULT_API_VERSION,
) -> tuple[list[Path], list[str]]:
    """The DynamoGraphDeployment tree (+ llmapi's engine args as files, for the local commands); returns
    the written files and the two commands that serve the same on one machine."""
    import yaml

    cfg = cfg.for_variant(cfg.variant(variant))
    if cfg.build.target in dynamo.IMAGES:
        _hold(*images.dynamo_line_refusal(cfg, dynamo.IMAGES[cfg.build.target]))

    objects = dynamo.dynamo_objects(
        cfg, variant, disagg=disagg, model_path=model_path, api_version=api_version
    )
    files: dict = {file_name(o): o for o in objects}
    files["kustomization.yaml"] = kustomization(
        [file_name(o) for o in objects],
        namespace=cfg.deploy.namespace,
        images=images.kustomize_images(images.of(objects)),
    )
    written = write_tree(out, files)
    engine = Path(out) / "engine"
    for config_map in (o for o in objects if o["kind"] == "ConfigMap"):  # llmapi: the LLM-API YAMLs
        engine.mkdir(exist_ok=True)
        for name, text in config_map["data"].items():
            (engine / name).write_text(text, encoding="utf-8")
            written.append(engine / name)
        if disagg:
            (engine / "worker.yaml").write_text(
                yaml.safe_dump(dynamo.engine_args(cfg, variant, "worker"), sort_keys=False), encoding="utf-8"
            )
            written.append(engine / "worker.yaml")
    local = model_path if model_path and not model_path.startswith(k8s.MODELS_MOUNT) else None
    return written, dynamo.local_commands(cfg, variant, engine.resolve(), local)
