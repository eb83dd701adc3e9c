"""Run a generated pod's containers on this machine the way the kubelet would, without a cluster.

For every container whose image LPX builds (Dockerfile / Dockerfile.slim: `lpx` is the ENTRYPOINT), the
command and args run as a process with:
- the pod's network: one network namespace per pod (`unshare --net`, loopback up), so the containers
  reach each other on 127.0.0.1 and nothing collides with other servers on this machine;
- its volumes: emptyDirs as temp folders (group fsGroup, setgid, as the kubelet does), Secrets and
  ConfigMaps as files (Secrets from test fixtures, ConfigMaps from the generated objects), PVCs as fixture
  folders; each bind-mounted at its mountPath in a private mount namespace, read-only mounts remounted
  read-only (`mount -o remount,bind,ro`: writes fail with EROFS, as in the pod);
- its env (value, configMapKeyRef, secretKeyRef), its runAsUser / runAsGroup / fsGroup (setpriv), and
  `lpx` resolved to this checkout's venv; no GPU (CUDA_VISIBLE_DEVICES empty; this machine has none).
Then its readiness probe (httpGet path and port, or tcpSocket) is polled from inside the pod's network
until it succeeds; if the process exits first, or the probe never passes, PodFailure carries its log.

The uid keeps one capability, CAP_DAC_READ_SEARCH (read and search, never write), only because this
machine's Python lives under /root (mode 700). Mount points outside the temp folders (/models, /etc/lpx/keys, /home/lpx/.lpx ...) are created empty on
this machine's root filesystem when missing: a mount namespace can cover a folder, not create one.
Needs root (mount and user namespaces); callers skip when not root.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import http.server
import os
import select
import shlex
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
HOLD = Path("/run/lpx-pod-runner/checkout")  # where the checkout is held while a pod's mounts cover it
CLONE_NEWNET = 0x40000000


class PodFailure(AssertionError):
    pass


def entrypoint(dockerfile: Path) -> list[str]:
    """The ENTRYPOINT of a Dockerfile (exec form), e.g. ["lpx"]."""
    import json

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


def _libc_setns(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
    finally:
        os.close(fd)


def in_netns(pid: int, fn):
    """fn() on a thread that joined the network namespace of `pid` (setns is per thread)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            _libc_setns(pid)
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


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


@dataclass
class Pod:
    """One pod: its network namespace, its volumes, its running containers."""

    spec: dict
    work: Path
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> {key: content}
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    claims: dict[str, Path] = field(default_factory=dict)  # PVC name -> folder
    running: list[Running] = field(default_factory=list)
    holder: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.fs_group = self.spec.get("securityContext", {}).get("fsGroup")
        self.sources = {v["name"]: self._volume(v) for v in self.spec.get("volumes", [])}
        # The holder says "up" once it is in its own network namespace with loopback up. Polling
        # /proc/<pid>/ns/net from the start raced unshare: read before unshare(2) it is this process's own
        # namespace, so the check passed there while the pod's loopback was still down, and a file server or
        # a curl started next landed in different namespaces or found no loopback (CI, loaded machine).
        self.holder = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep 100000"],
            start_new_session=True,
            stdout=subprocess.PIPE,
        )
        ready, _, _ = select.select([self.holder.stdout], [], [], 60)
        line = self.holder.stdout.readline() if ready else b""  # EOF (b"") if unshare or ip failed
        self.holder.stdout.close()
        if line != b"up\n":
            raise PodFailure(
                f"the pod's network namespace did not come up (holder exit {self.holder.poll()})"
            )
        if not in_netns(self.holder.pid, _lo_up):
            raise PodFailure("the pod's loopback carries no connection")

    def _volume(self, v: dict) -> Path:
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
        elif "emptyDir" not in v:
            raise PodFailure(f"volume {v['name']}: kind not handled by the runner: {sorted(v)}")
        for key, text in files.items():
            (folder / key).write_text(text)
            os.chmod(folder / key, mode | (0o440 if self.fs_group is not None else 0))
        if self.fs_group is not None:  # the kubelet's fsGroup ownership: group-owned, setgid folders
            for p in [folder, *folder.rglob("*")]:
                os.chown(p, 0, self.fs_group)
            os.chmod(folder, 0o2775 if "emptyDir" in v else 0o2755)
        return folder

    def env(self, c: dict) -> dict[str, str]:
        env = {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/home/lpx",
            "CUDA_VISIBLE_DEVICES": "",
            "NO_PROXY": "*",
            "LANG": "C.UTF-8",
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
        script = ["set -e"]
        mounts = sorted(c.get("volumeMounts", []), key=lambda m: m["mountPath"] == "/tmp")  # /tmp last
        # the checkout and its venv stand in for the image's installed LPX: when a mount covers them (CI's
        # clone under /tmp, and the pod's /tmp volume), they are held aside first and bound back on top
        covered = [m["mountPath"] for m in mounts if ROOT.is_relative_to(m["mountPath"])]
        if covered:
            HOLD.mkdir(parents=True, exist_ok=True)
            script.append(f"mount --bind {shlex.quote(str(ROOT))} {shlex.quote(str(HOLD))}")
        for m in mounts:
            src, dst = self.sources[m["name"]], m["mountPath"]
            Path(dst).mkdir(parents=True, exist_ok=True)
            script.append(f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}")
            if m.get("readOnly"):
                script.append(f"mount -o remount,bind,ro {shlex.quote(dst)}")
        if covered:
            script.append(f"mkdir -p {shlex.quote(str(ROOT))}")
            script.append(f"mount --bind {shlex.quote(str(HOLD))} {shlex.quote(str(ROOT))}")
        user = ["setpriv", "--reuid", str(sc["runAsUser"]), "--regid", str(sc.get("runAsGroup", 0))]
        user += ["--groups", str(self.fs_group)] if self.fs_group is not None else ["--clear-groups"]
        # this machine's interpreter lives under /root (mode 700); in the image it is world-readable. Read
        # and search only: writes still need the uid's own permissions, and read-only mounts stay EROFS.
        user += ["--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]
        if "runAsUser" not in sc:
            user = []
        env = [f"{k}={v}" for k, v in self.env(c).items()]
        script.append("exec " + shlex.join([*user, "env", "-i", *env, *command]))
        log = self.work / f"{c['name']}.log"
        handle = open(log, "wb")
        proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/proc/{self.holder.pid}/ns/net",
                "unshare",
                "--mount",
                "sh",
                "-c",
                "\n".join(script),
            ],
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
        return r

    def wait_ready(self, c: dict, r: Running, timeout: float) -> float:
        """Poll c's readiness probe from inside the pod until it passes; seconds it took."""
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
        probe = c.get("readinessProbe")
        if probe is None:
            raise PodFailure(f"container {c['name']} has no readiness probe")
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if r.proc.poll() is not None:
                raise PodFailure(
                    f"container {c['name']} exited {r.proc.returncode} before ready:\n{r.tail()}"
                )
            if in_netns(self.holder.pid, lambda: probe_once(probe, ports)):
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
        if self.holder and self.holder.poll() is None:
            os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait()

    def cleanup(self) -> None:
        """Stop everything; the work folder (logs, volumes) stays for pytest's tmp_path to reap."""
        self.stop()


def _lo_up() -> bool:
    """Loopback carries a connection. Binding 127.0.0.1 is not enough: under gVisor (this machine's sandbox) the
    bind succeeds before `ip link set lo up` has run, and a connect then fails with ENETUNREACH."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            socket.create_connection(s.getsockname(), timeout=2).close()
        return True
    except OSError:
        return False


class _FileServer(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host up by reverse DNS (socket.getfqdn) between bind() and listen();
        # inside a pod's network with no resolver that lookup is not wanted.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _QuietFileHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def file_server(pid: int, folder: Path, port: int):
    """Serve `folder` over HTTP at 127.0.0.1:port inside the network namespace of `pid`, from threads of this
    process. The socket is made, bound and listening inside that namespace (a socket keeps the namespace it was
    made in) before this yields, so there is no readiness to poll, and no second process that could land in
    another namespace."""
    handler = functools.partial(_QuietFileHandler, directory=str(folder))
    server = in_netns(pid, lambda: _FileServer(("127.0.0.1", port), handler))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def resolve_command(c: dict, images: dict[str, list[str]]) -> list[str]:
    """The process a container runs: command or the image's ENTRYPOINT, then args; `lpx` -> this venv."""
    command = list(c.get("command") or images[c["image"]]) + list(c.get("args", []))
    if command[0] == "lpx":
        command[0] = str(VENV_BIN / "lpx")
    return command
