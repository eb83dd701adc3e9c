"""A LeaderWorkerSet for an engine whose tp_size x pp_size spans nodes (k8s.is_lws): the leader's pod is
the single-node pod; the workers hold their GPUs and run sshd for the leader's mpirun (mpi.py)."""

from __future__ import annotations

from typing import Any

from ..config import Config
from ..errors import UsageError
from . import k8s, mpi

# Why a LeaderWorkerSet name must be shorter than the 63 characters its webhook accepts (DNS-1035 label:
# kubernetes-sigs/lws pkg/webhooks/leaderworkerset_webhook.go at 060ab4da17eea1f0865fcbd3236bb1075e2cea32):
# the worker StatefulSet of group g is named after its leader pod, <lws>-<g> (pkg/controllers/
# pod_controller.go, constructWorkerStatefulSetApplyConfiguration, same commit), and the StatefulSet
# controller labels every pod it creates controller-revision-hash=<statefulset>-<hash>, the hash an FNV-32
# sum in decimal, up to 10 characters (kubernetes/kubernetes pkg/controller/history/controller_history.go,
# ControllerRevisionName / HashControllerRevision, at 01ccd2e19eb709d63fe770a70fcc817695dc7e32). A label
# value holds at most 63 characters, so the API server rejects the worker pods of a longer name (LWS issue
# #410; LWS's troubleshooting page gives "51 - int(replicas / 10)", which a 10-digit hash, 77% of them,
# exceeds by one). Read 2026-12-07.
LABEL_MAX = 63
REVISION_HASH_MAX = 10


def max_name_length(groups: int) -> int:
    """The longest LeaderWorkerSet name whose `groups` groups all get worker pods: <name>-<g>-<hash>."""
    return LABEL_MAX - 1 - REVISION_HASH_MAX - 1 - len(str(max(groups, 1) - 1))


def check_name(cfg: Config, name: str) -> None:
    groups = cfg.deploy.autoscaling.max_replicas  # the HPA may scale the set up to this many groups
    limit = max_name_length(groups)
    if len(name) > limit:
        raise UsageError(
            f"LeaderWorkerSet name {name!r} has {len(name)} characters; with up to {groups} groups "
            f"(deploy.autoscaling.max_replicas) the LWS controller cannot create worker pods for names above "
            f"{limit} (a worker pod's controller-revision-hash label, <name>-<group>-<hash>, must fit 63) - "
            "shorten model.name or the variant's name (the name is lpx-<model>-<variant>-<arch>)"
        )


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
    name = k8s.workload_name(cfg, variant, arch)
    check_name(cfg, name)
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
        k8s.meta(cfg, variant, name, k8s.POD_SKIPS),
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
