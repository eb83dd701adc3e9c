"""A LeaderWorkerSet for an engine whose tp_size x pp_size spans nodes (k8s.is_lws): the leader's pod is
the single-node pod; the workers hold their GPUs and run sshd for the leader's mpirun (mpi.py)."""

from __future__ import annotations

from typing import Any

from ..config import Config
from ..errors import UsageError
from . import k8s, mpi


def leader_worker_set(cfg: Config, variant: str, arch: str) -> dict[str, Any]:
    """tp x pp above one node: a group of world / gpus_per_node pods. The leader runs `lpx serve`, whose
    mpirun spans the group (servers/ranks.py derives the hosts from the LWS_* variables the
    LeaderWorkerSet controller sets); workers hold their GPUs and run sshd, non-root, on port 2222 for
    mpirun to start their ranks, with keys from deploy.ssh_secret (mpi.py)."""
    per_node = cfg.deploy.gpus_per_node
    world = k8s.gpus(cfg)
    if cfg.build.target == "vllm":
        raise UsageError(
            f"build.target vllm: tp_size x pp_size = {world} GPUs span nodes of {per_node}; LPX runs vLLM in "
            "one pod (its multi-node mode needs a Ray cluster LPX does not deploy) - keep tp_size x pp_size "
            "<= deploy.gpus_per_node, or serve it with 'lpx deploy dynamo'"
        )
    if world % per_node:
        raise UsageError(
            f"tp_size x pp_size = {world} GPUs do not fill whole nodes of {per_node} - set "
            "deploy.gpus_per_node to a divisor of it"
        )
    pod_labels = {**k8s.labels(cfg, variant), **k8s.arch_labels(cfg, variant, arch)}
    leader = k8s.pod_spec(cfg, variant, arch, per_node)
    worker = k8s.pod_spec(cfg, variant, arch, per_node, gateway=False)
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
    return k8s.resource(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        k8s.meta(cfg, variant, k8s.workload_name(cfg, variant, arch), k8s.POD_SKIPS),
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
