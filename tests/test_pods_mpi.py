"""The multi-node path run for real (issue 42): the LeaderWorkerSet `lpx deploy k8s` writes for an engine
whose tp_size x pp_size spans two nodes, its leader and worker started by the pod runner as separate pods
(tests/pod_runner.py: their own network namespaces on one bridge, their hostnames, the names LWS's headless
Service gives them in /etc/hosts, the LWS_* variables its controller injects), in the engine image as far as
it exists here: Debian's Open MPI and OpenSSH (`make mpi-tools`, .tools/mpi) laid over the root
filesystem at the paths the image has them, read-only, uid 1000, no capabilities.

The worker runs its real container command (mpi.worker_command: the setup script, then /usr/sbin/sshd);
the leader runs the real mpirun that `lpx serve` composes there (ranks.mpi_command, the hosts derived from
LWS_LEADER_ADDRESS / LWS_GROUP_SIZE) with the manifest's env (OMPI_MCA_plm_rsh_args) and the Secret's keys,
made with the unpacked ssh-keygen as docs/deploy.md says. A stand-in (tests/standin_rank.py) takes
tritonserver's place in every rank - TensorRT-LLM and GPUs cannot run here - and reports its rank, host
and the environment TensorRT-LLM reads. Before issue 42 this failed: mpirun's `--mca plm_rsh_args "-p 2222"`
hid the env's key and known_hosts from ssh; Open MPI cut the workers' names at the first dot (no DNS record
in a cluster); and sshd used only the first of the worker's SetEnv lines, so ranks there ran without the
container's PATH, LPX_HOME, CUDA_* and NVIDIA_* (pipeline/deploy/mpi.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pod_runner import MPI_LAYER, ClusterNetwork, Pod, PodFailure, lws_group, resolve_command

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_k8s, images, lws, mpi
from pipeline.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "standin_rank.py"
OLD_MPIRUN = ["--mca", "plm_rsh_args", "-p 2222"]  # what ranks.mpi_command added before issue 42


def config(tp: int, pp: int, gpus_per_node: int, name: str = "tiny-llama", **autoscaling):
    data = demo_config_dict("/nonexistent/checkpoint")
    data["model"]["name"] = name
    data["build"].update({"target": "engine", "archs": ["sm90"], "tp_size": tp, "pp_size": pp})
    data["deploy"] = {"gpus_per_node": gpus_per_node, **({"autoscaling": autoscaling} if autoscaling else {})}
    return parse_config(data)


def tree(cfg, out: Path) -> tuple[dict, dict[str, dict[str, str]]]:
    """The LeaderWorkerSet `lpx deploy k8s` wrote, and every ConfigMap of the tree."""
    deploy_k8s(cfg, cfg.variants[0].name, out)
    docs = [d for f in sorted(out.rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    (doc,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    return doc, {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}


def ssh_keys(folder: Path, namespace: str, secret: str) -> dict[str, str]:
    """The Secret deploy.ssh_secret, made by the commands `lpx deploy k8s` prints (mpi.secret_command, as
    docs/deploy.md gives them) with the unpacked ssh-keygen, up to the `kubectl create secret` that would
    take the four files."""
    keygen, _, kubectl = mpi.secret_command(namespace, secret).rpartition(" && kubectl ")
    assert kubectl.split()[-4:] == [f"--from-file={k}" for k in mpi.SECRET_KEYS]
    folder.mkdir()
    env = {**os.environ, "PATH": f"{MPI_LAYER / 'usr' / 'bin'}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", keygen], cwd=folder, env=env, check=True, capture_output=True)
    return {k: (folder / k).read_text() for k in mpi.SECRET_KEYS}


def test_deploy_k8s_prints_the_ssh_secret_only_for_a_leaderworkerset(tmp_path) -> None:
    from click.testing import CliRunner

    from pipeline.cli import cli

    for tp, lines in ((8, 1), (2, 0)):  # 16 GPUs over nodes of 8: a LeaderWorkerSet; 4: a Deployment
        cfg = tmp_path / f"lpx-{tp}.yaml"
        data = demo_config_dict("/nonexistent/checkpoint")
        data["build"].update({"target": "engine", "archs": ["sm90"], "tp_size": tp, "pp_size": 2})
        data["deploy"] = {"gpus_per_node": 8}
        cfg.write_text(yaml.safe_dump(data))
        res = CliRunner().invoke(cli, ["deploy", "k8s", "-c", str(cfg), "--out", str(tmp_path / f"out{tp}")])
        assert res.exit_code == 0, res.output
        printed = [ln for ln in res.output.splitlines() if "lpx-mpi-ssh" in ln]
        assert len(printed) == lines and all(mpi.secret_command("lpx", "lpx-mpi-ssh") in ln for ln in printed)


def test_lws_names_are_refused_above_what_the_controller_can_create(tmp_path) -> None:
    """A worker pod's controller-revision-hash label is <lws>-<group>-<hash of up to 10 characters> and
    holds at most 63: 50 characters for up to 10 groups, 49 for up to 100 (pipeline/deploy/lws.py names the
    sources). The longest accepted name fits with the longest hash; one more is refused with the fix."""
    assert lws.max_name_length(4) == 50 and lws.max_name_length(10) == 50 and lws.max_name_length(11) == 49
    for groups in (1, 4, 10, 11, 100, 101):
        limit, longest = lws.max_name_length(groups), str(groups - 1)
        assert len(f"{'x' * limit}-{longest}-{'4294967295'}") == 63  # 2**32 - 1: the longest FNV-32 hash
    doc, _ = tree(config(8, 2, 8, name="m" * 30), tmp_path / "ok")
    assert len(doc["metadata"]["name"]) == 43  # lpx-<model>-fp8-sm90: 13 characters around the model name
    long = "m" * 38  # 51 characters: the LWS webhook takes it (DNS-1035, <= 63), its workers never start
    with pytest.raises(UsageError, match=r"has 51 characters.*above 50.*shorten model.name"):
        tree(config(8, 2, 8, name=long), tmp_path / "long")
    doc, _ = tree(config(8, 2, 8, name="m" * 37), tmp_path / "edge")
    assert len(doc["metadata"]["name"]) == 50
    with pytest.raises(UsageError, match=r"with up to 11 groups.*above 49"):
        tree(config(8, 2, 8, name="m" * 37, max_replicas=11), tmp_path / "many")


def start_group(cfg, doc, maps, tmp_path: Path, net: ClusterNetwork) -> list[Pod]:
    """The group's pods, as the LWS controller and the kubelet make them, on one network."""
    d, image = cfg.deploy, images.server(cfg)
    keys = ssh_keys(tmp_path / "keys", d.namespace, d.ssh_secret)
    secrets = {d.ssh_secret: keys, d.keys_secret: {"keys.json": '{"keys": []}'}}
    (tmp_path / "models").mkdir()
    pods = [
        Pod(
            p["spec"],
            tmp_path / p["name"],
            secrets=secrets,
            config_maps=maps,
            claims={d.repository.pvc or "lpx-models": tmp_path / "models"},
            name=p["name"],
            namespace=p["namespace"],
            subdomain=p["subdomain"],
            # NVIDIA's device plugin gives a container its GPUs by NVIDIA_VISIBLE_DEVICES (none here: named)
            env={**p["env"], "NVIDIA_VISIBLE_DEVICES": f"GPU-{p['name']}-0,GPU-{p['name']}-1"},
            layers={image: [MPI_LAYER]},
        )
        for p in lws_group(doc)
    ]
    for pod in pods:
        pod.ip = net.attach(pod.net_pid)
    for pod in pods:
        pod.set_hosts([o.record() for o in pods if o is not pod])
    return pods


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="the pod runner needs root (mount and network namespaces)")
@pytest.mark.skipif(
    not (MPI_LAYER / ".lpx-installed").is_file(), reason="no .tools/mpi - run 'make mpi-tools'"
)
@pytest.mark.parametrize("old", [False, True], ids=["mpirun-as-composed", "mpirun-before-issue-42"])
def test_leader_mpirun_starts_ranks_on_the_worker_pod_over_its_sshd(tmp_path, old) -> None:
    """4 ranks (tp 2 x pp 2, 2 GPUs per node) over the group's 2 pods. With the command line of before
    issue 42 (`--mca plm_rsh_args "-p 2222"`, which Open MPI takes over the env) ssh gets neither the
    Secret's known_hosts nor its key, and mpirun fails: "Host key verification failed"."""
    cfg = config(tp=2, pp=2, gpus_per_node=2)
    doc, maps = tree(cfg, tmp_path / "tree")
    net = ClusterNetwork()
    pods: list[Pod] = []
    try:
        pods = start_group(cfg, doc, maps, tmp_path, net)
        leader, worker = pods
        (sshd,) = worker.spec["containers"]
        worker.wait_ready(sshd, worker.start(sshd, resolve_command(sshd, {})), timeout=60)
        triton = leader.spec["containers"][0]
        launch = [sys.executable, str(STANDIN), "launch", "4", *(OLD_MPIRUN if old else [])]
        if old:
            with pytest.raises(PodFailure, match=r"(?s)exited [1-9].*Host key verification failed"):
                leader.run(triton, launch, timeout=120)
            return
        log = leader.run(triton, launch, timeout=120).tail(200_000)
    finally:
        for pod in reversed(pods):
            pod.cleanup()
        net.stop()
    check_ranks(log, leader, worker)


def check_ranks(log: str, leader: Pod, worker: Pod) -> None:
    """Ranks 0..3 ran, 0-1 in the leader's pod and 2-3 in the worker's (Open MPI maps by slot), each with
    the env TensorRT-LLM reads; ranks other than 0 logged to their own pod's LPX_HOME."""
    hosts = {leader.name: (leader, [0, 1]), worker.name: (worker, [2, 3])}
    said = {ln for ln in log.splitlines() if ln.startswith("standin rank")}
    assert said == {f"standin rank {r} on {h}" for h, (_, ranks) in hosts.items() for r in ranks}, log[-3000:]
    reports = {
        r: json.loads((pod.sources["lpx-home"] / f"standin-rank{r}.json").read_text())
        for pod, ranks in hosts.values()
        for r in ranks
    }
    for host, (pod, ranks) in hosts.items():
        for local, rank in enumerate(ranks):
            r = reports[rank]
            assert r["host"] == host and r["uid"] == 1000, r
            env = r["env"]
            assert env["OMPI_COMM_WORLD_SIZE"] == "4" and env["OMPI_COMM_WORLD_RANK"] == str(rank)
            assert (
                env["OMPI_COMM_WORLD_LOCAL_RANK"] == str(local) and env["OMPI_COMM_WORLD_LOCAL_SIZE"] == "2"
            )
            # the container's env reaches every rank (the worker's through its sshd's SetEnv line)
            assert env["CUDA_VISIBLE_DEVICES"] == "" and env["LPX_HOME"] == "/home/lpx/.lpx"
            assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{host}-0,GPU-{host}-1"
            assert str(Path(sys.executable).parent) in env["PATH"].split(":")
            if rank:
                assert "--load-model=tensorrt_llm" in r["args"] and "--allow-http=false" in r["args"]
                logged = pod.sources["lpx-home"] / "logs" / f"triton-rank{rank}.log"
                assert json.loads(logged.read_text())["rank"] == rank
            else:
                assert "--http-port=8000" in r["args"] and "--model-control-mode=none" in r["args"]
    assert reports[0]["netns"] == reports[1]["netns"] != reports[2]["netns"] == reports[3]["netns"]
    assert "OMPI_MCA_plm_rsh_args" in reports[2]["env"], "the worker's sshd forwards its container's OMPI_*"
