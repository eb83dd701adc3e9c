"""Run a generated pod's containers on this machine the way the kubelet would, without a cluster.

For every container whose image LPX builds (Dockerfile / Dockerfile.slim / Dockerfile.vllm: `lpx` is the
ENTRYPOINT), and for containers of other images whose programs are here (sshd, mpirun, curl, tar), the
command and args run as a process with:
- the pod's sandbox (tests/pod_network.py): its own network namespace (loopback up; pods of one group
  joined by a bridge, each with an eth0 address), its hostname, and the pod's /etc/hosts, /etc/hostname and
  /etc/resolv.conf - names of the other pods resolving as a headless Service makes them;
- the container's own root filesystem (tests/pod_container.py): this machine's root as the lowest image layer,
  the image's extra layers (Debian's Open MPI and OpenSSH from `make mpi-tools`, at the paths the image has
  them) over it, read-only when readOnlyRootFilesystem says so: the container writes only into its volumes;
- its volumes: emptyDirs as folders (group fsGroup, setgid, as the kubelet does; the disk usage measured
  against sizeLimit, PodFailure when the kubelet would evict the pod; medium Memory as a tmpfs of the
  sizeLimit shared by the pod's containers), Secrets and ConfigMaps as files (Secrets from test fixtures,
  ConfigMaps from the generated objects), PVCs as fixture folders; read-only mounts remounted read-only;
- its env (value, configMapKeyRef, secretKeyRef; what a controller injects, e.g. LWS_*), its runAsUser /
  runAsGroup / fsGroup, capabilities (the runtime's default set minus drop, plus add: with drop ALL and a
  non-root uid the process has none), no_new_privs for allowPrivilegeEscalation false; `lpx` resolved to
  this checkout's venv; no GPU (CUDA_VISIBLE_DEVICES empty; this machine has none).
Then its readiness probe (httpGet path and port, or tcpSocket) is polled from inside the pod's network
until it succeeds; if the process exits first, or the probe never passes, PodFailure carries its log.

What it cannot: pull or run the images themselves (the checkout's venvs and this machine's programs stand
in for their contents; a container of an image whose program is not here is checked by its command line
only, tests/upstream_cli.py), a GPU, seccomp profiles, cgroup limits (cpu, memory), a real DNS server or
cluster Services (names come from /etc/hosts). Needs root (mount, network and UTS namespaces, overlayfs);
callers skip when not root.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pod_container
from pod_network import (
    ClusterNetwork,
    Record,
    file_server,
    hosts_file,
    in_netns,
    kill,
    kill_namespace,
    resolv_conf,
    sandbox,
)

from pipeline.deploy.delivery import quantity_bytes

__all__ = ["ClusterNetwork", "file_server", "in_netns"]
ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MPI_LAYER = ROOT / ".tools" / "mpi"  # make mpi-tools: Open MPI and OpenSSH as the engine image has them


class PodFailure(AssertionError):
    pass


def entrypoint(dockerfile: Path) -> list[str]:
    """The ENTRYPOINT of a Dockerfile (exec form), e.g. ["lpx"]."""
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            return json.loads(line.split(None, 1)[1])
    raise AssertionError(f"{dockerfile} has no ENTRYPOINT")


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """(role, pod spec) of every pod template in a workload object (Deployment, LeaderWorkerSet,
    DynamoGraphDeployment v1beta1)."""
    kind = doc["kind"]
    if kind == "Deployment":
        return [("pod", doc["spec"]["template"]["spec"])]
    if kind == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        return [("leader", t["leaderTemplate"]["spec"]), ("worker", t["workerTemplate"]["spec"])]
    if kind == "DynamoGraphDeployment" and "components" in doc["spec"]:
        return [(c["name"], c["podTemplate"]["spec"]) for c in doc["spec"]["components"]]
    if kind == "DynamoGraphDeployment":
        out = []
        for name, s in doc["spec"]["services"].items():
            extra = dict(s.get("extraPodSpec", {}))
            main = extra.pop("mainContainer", {})
            out.append((name, {**extra, "containers": [{"name": "main", **main}]}))
        return out
    return []


def lws_group(doc: dict, group: int = 0) -> list[dict[str, Any]]:
    """The pods of one LeaderWorkerSet group as its controller makes them (kubernetes-sigs/lws at
    060ab4da17eea1f0865fcbd3236bb1075e2cea32, read 2026-12-07): the leader <lws>-<g>, the workers of the
    StatefulSet <lws>-<g> with ordinals from 1, <lws>-<g>-<i> (pkg/controllers/pod_controller.go); hostname =
    pod name, subdomain = <lws> (SubdomainShared, the default); the env its pod webhook injects first
    (pkg/utils/pod/pod_utils.go AddLWSVariables): LWS_LEADER_ADDRESS=<lws>-<g>.<subdomain>.<namespace>,
    LWS_GROUP_SIZE, LWS_WORKER_INDEX. Each: {name, spec, subdomain, namespace, env}."""
    name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
    t = doc["spec"]["leaderWorkerTemplate"]
    leader = f"{name}-{group}"
    env = {"LWS_LEADER_ADDRESS": f"{leader}.{name}.{namespace}", "LWS_GROUP_SIZE": str(t["size"])}
    pods = [(leader, t["leaderTemplate"]["spec"], 0)]
    pods += [(f"{leader}-{i}", t["workerTemplate"]["spec"], i) for i in range(1, t["size"])]
    return [
        {
            "name": n,
            "spec": s,
            "subdomain": name,
            "namespace": namespace,
            "env": {**env, "LWS_WORKER_INDEX": str(i)},
        }
        for n, s, i in pods
    ]


def probe_once(probe: dict, ports: dict[str, int]) -> bool:
    """One readiness check as the kubelet makes it: HTTP 200-399, or a TCP connect."""
    if "httpGet" in probe:
        get = probe["httpGet"]
        port = ports.get(get["port"], get["port"])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}", timeout=3) as r:
                return 200 <= r.status < 400
        except OSError:
            return False
    if "tcpSocket" in probe:
        port = ports.get(probe["tcpSocket"]["port"], probe["tcpSocket"]["port"])
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
            return True
        except OSError:
            return False
    raise PodFailure(f"probe kind not handled by the runner: {sorted(probe)}")


@dataclass
class Running:
    name: str
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def usage_bytes(folder: Path) -> int:
    """Disk usage as the kubelet measures an emptyDir (du: allocated blocks)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for n in dirnames + filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
    return total


@dataclass
class Pod:
    """One pod: its sandbox (network, hostname, shared mounts), its volumes, its running containers.

    network: another pod whose network (and hostname) this pod's containers join instead of their own.
    layers: image -> its layers over this machine's root (e.g. {engine image: [MPI_LAYER]}).
    env: what a controller injects into every container (LWS_* for a LeaderWorkerSet's pods)."""

    spec: dict
    work: Path
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> {key: content}
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    claims: dict[str, Path] = field(default_factory=dict)  # PVC name -> folder
    name: str = "lpx-pod"
    namespace: str = "lpx"
    subdomain: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    network: Pod | None = None
    layers: dict[str, list[Path]] = field(default_factory=dict)
    running: list[Running] = field(default_factory=list)
    holder: subprocess.Popen | None = None
    ip: str | None = None

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.fs_group = self.spec.get("securityContext", {}).get("fsGroup")
        self.limits: dict[str, int] = {}  # disk emptyDir -> sizeLimit bytes
        memory: list[tuple[Path, int, int | None]] = []
        self.sources = {v["name"]: self._volume(v, memory) for v in self.spec.get("volumes", [])}
        self.etc = {n: self.work / "etc" / n for n in ("hosts", "hostname", "resolv.conf")}
        self.etc["hosts"].parent.mkdir(exist_ok=True)
        self.set_hosts([])
        self.etc["hostname"].write_text(self.name + "\n")
        self.etc["resolv.conf"].write_text(resolv_conf(self.namespace))
        self.holder = sandbox(None if self.network else self.name, memory)
        self.started = 0

    @property
    def net_pid(self) -> int:
        return self.network.net_pid if self.network else self.holder.pid

    def record(self) -> Record:
        assert self.ip, f"pod {self.name} is on no cluster network"
        return Record(self.ip, self.name, self.subdomain, self.namespace)

    def set_hosts(self, others: list[Record]) -> None:
        """The pod's /etc/hosts: its own names, and the other pods' records (pod_network.py); written in
        place, so containers already running see it (a bind mount of this file)."""
        own = self.record() if self.ip else None
        self.etc["hosts"].write_text(hosts_file(own, others))

    def _volume(self, v: dict, memory: list) -> Path:
        folder = self.work / "volumes" / v["name"]
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            if claim not in self.claims:
                raise PodFailure(f"volume {v['name']}: no fixture for PVC {claim!r}")
            return self.claims[claim]
        folder.mkdir(parents=True, exist_ok=True)
        files: dict[str, str] = {}
        if "secret" in v:
            name = v["secret"]["secretName"]
            if name not in self.secrets:
                raise PodFailure(f"volume {v['name']}: Secret {name!r} is neither generated nor a fixture")
            files, mode = self.secrets[name], v["secret"].get("defaultMode", 0o644)
        elif "configMap" in v:
            name = v["configMap"]["name"]
            if name not in self.config_maps:
                raise PodFailure(f"volume {v['name']}: ConfigMap {name!r} is not generated")
            files, mode = self.config_maps[name], v["configMap"].get("defaultMode", 0o644)
        elif "emptyDir" in v:
            limit = v["emptyDir"].get("sizeLimit")
            if v["emptyDir"].get("medium") == "Memory":  # a tmpfs of the limit (node memory otherwise)
                memory.append((folder, quantity_bytes(limit) if limit else 2**40, self.fs_group))
                return folder
            if limit:
                self.limits[v["name"]] = quantity_bytes(limit)
        else:
            raise PodFailure(f"volume {v['name']}: kind not handled by the runner: {sorted(v)}")
        for key, text in files.items():
            (folder / key).write_text(text)
            os.chmod(folder / key, mode | (0o440 if self.fs_group is not None else 0))
        if self.fs_group is not None:  # the kubelet's fsGroup ownership: group-owned, setgid folders
            for p in [folder, *folder.rglob("*")]:
                os.chown(p, 0, self.fs_group)
            os.chmod(folder, 0o2775 if "emptyDir" in v else 0o2755)
        return folder

    def check_usage(self) -> None:
        """PodFailure when a disk emptyDir holds more than its sizeLimit (the kubelet evicts the pod)."""
        for name, limit in self.limits.items():
            used = usage_bytes(self.sources[name])
            if used > limit:
                raise PodFailure(f"emptyDir {name} uses {used} bytes, over its sizeLimit {limit}: evicted")

    def container_env(self, c: dict) -> dict[str, str]:
        env = {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/home/lpx",
            "CUDA_VISIBLE_DEVICES": "",
            "NO_PROXY": "*",
            "LANG": "C.UTF-8",
            **self.env,
        }
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
                continue
            ref = e["valueFrom"]
            source, key = (
                (self.config_maps, ref["configMapKeyRef"])
                if "configMapKeyRef" in ref
                else (self.secrets, ref["secretKeyRef"])
            )
            try:
                env[e["name"]] = source[key["name"]][key["key"]]
            except KeyError:
                raise PodFailure(f"{c['name']}: env {e['name']} refers to missing {key}") from None
        return env

    def start(self, c: dict, command: list[str]) -> Running:
        """Run container `c` with `command` (its entrypoint + args, `lpx` already resolved)."""
        sc = {**self.spec.get("securityContext", {}), **c.get("securityContext", {})}
        if any("subPath" in m for m in c.get("volumeMounts", [])):
            raise PodFailure(f"{c['name']}: subPath mounts are not handled by the runner")
        mounts = [
            (self.sources[m["name"]], m["mountPath"], bool(m.get("readOnly")))
            for m in c.get("volumeMounts", [])
        ]
        groups = self.spec.get("securityContext", {}).get("supplementalGroups", [])
        try:
            user = pod_container.user_args(sc, self.fs_group, groups)
        except pod_container.ContainerFailure as exc:
            raise PodFailure(f"{c['name']}: {exc}") from None
        self.started += 1
        base = self.work / "rootfs" / f"{c['name']}-{self.started}"
        base.mkdir(parents=True)
        layers = self.layers.get(c.get("image", ""), [])
        script = pod_container.script(
            base, layers, mounts, self.etc, sc, user, self.container_env(c), command, c.get("workingDir", "/")
        )
        log = self.work / f"{c['name']}.log"
        handle = open(log, "ab")
        net = f"/proc/{self.net_pid}/ns"
        proc = subprocess.Popen(
            ["nsenter", f"--net={net}/net", f"--uts={net}/uts", f"--mount=/proc/{self.holder.pid}/ns/mnt"]
            + ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        r = Running(c["name"], proc, log)
        self.running.append(r)
        return r

    def run(self, c: dict, command: list[str], timeout: float = 60) -> Running:
        """Run container `c` with `command` to completion (an init step); PodFailure unless it exits 0."""
        r = self.start(c, command)
        try:
            r.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            raise PodFailure(f"{c['name']}: still running after {timeout:.0f} s:\n{r.tail()}") from None
        if r.proc.returncode != 0:
            raise PodFailure(f"{c['name']} exited {r.proc.returncode}:\n{r.tail()}")
        self.check_usage()
        return r

    def wait_ready(self, c: dict, r: Running, timeout: float) -> float:
        """Poll c's readiness probe from inside the pod until it passes; seconds it took."""
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
        probe = c.get("readinessProbe")
        if probe is None:
            raise PodFailure(f"container {c['name']} has no readiness probe")
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self.check_usage()
            if r.proc.poll() is not None:
                raise PodFailure(
                    f"container {c['name']} exited {r.proc.returncode} before ready:\n{r.tail()}"
                )
            if in_netns(self.net_pid, lambda: probe_once(probe, ports)):
                return time.monotonic() - t0
            time.sleep(0.5)
        raise PodFailure(
            f"container {c['name']}: readiness probe {probe} not passed in {timeout:.0f} s:\n{r.tail()}"
        )

    def stop(self) -> None:
        for r in reversed(self.running):
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGTERM)
                try:
                    r.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(r.proc.pid, signal.SIGKILL)
                    r.proc.wait()
        self.running.clear()
        if self.holder is not None and self.network is None and self.holder.poll() is None:
            kill_namespace(self.holder.pid)  # what left the containers' process groups (sshd's sessions)
        kill(self.holder)

    def cleanup(self) -> None:
        """Stop everything; the work folder (logs, volumes) stays for pytest's tmp_path to reap."""
        self.stop()


def resolve_command(c: dict, images: dict[str, list[str]]) -> list[str]:
    """The process a container runs: command or the image's ENTRYPOINT, then args; `lpx` -> this venv."""
    command = list(c.get("command") or images[c["image"]]) + list(c.get("args", []))
    if command[0] == "lpx":
        command[0] = str(VENV_BIN / "lpx")
    return command
