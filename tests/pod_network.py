"""The pod runner's networks (tests/pod_runner.py): each pod's sandbox, and a cluster network between pods.

- The sandbox: one process per pod, as the kubelet's pause container, holding the pod's network namespace
  (loopback up), its UTS namespace (the pod's hostname) and a mount namespace for what the pod's containers
  share (memory-backed emptyDirs: a tmpfs of the sizeLimit). Every container joins all three.
- The cluster network: pods that must reach each other (a LeaderWorkerSet group) get an eth0 on one bridge,
  in a network namespace of its own, as a CNI bridge plugin gives them: 10.244.0.<n>/24.
- Names: the kubelet writes the pod's /etc/hosts (localhost, and `<ip> <hostname>.<subdomain>.<namespace>
  .svc.cluster.local <hostname>` for a pod with a subdomain). There is no DNS server here: the records a
  headless Service makes for the other pods of its subdomain are written into the same file, under the names
  a pod's resolver reaches through its search path (`<namespace>.svc.cluster.local svc.cluster.local`):
  `<hostname>.<subdomain>`, `<hostname>.<subdomain>.<namespace>` and the full name - never the bare hostname
  of another pod, which no cluster record carries.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import http.server
import os
import select
import signal
import socket
import socketserver
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000
POD_CIDR = "10.244.0"


class NetworkFailure(AssertionError):
    pass


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


def lo_up() -> bool:
    """Loopback carries a connection. Binding 127.0.0.1 is not enough: under gVisor the bind succeeds before
    `ip link set lo up` has run, and a connect then fails with ENETUNREACH."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            socket.create_connection(s.getsockname(), timeout=2).close()
        return True
    except OSError:
        return False


def holder(flags: list[str], setup: list[str]) -> subprocess.Popen:
    """A process in new namespaces (`unshare` flags) that ran `setup` and says "up", then sleeps.

    It says "up" only once in its namespaces with the setup done. Polling /proc/<pid>/ns/net from the start
    raced unshare: read before unshare(2) it is this process's own namespace, so the check passed there while
    the pod's loopback was still down (CI, loaded machine)."""
    script = "set -e\n" + "\n".join(setup) + "\necho up\nexec sleep 100000"
    proc = subprocess.Popen(
        ["unshare", *flags, "sh", "-c", script], start_new_session=True, stdout=subprocess.PIPE
    )
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else b""  # EOF (b"") if unshare or a setup step failed
    proc.stdout.close()
    if line != b"up\n":
        kill(proc)
        raise NetworkFailure(f"namespace holder {flags} did not come up (exit {proc.poll()}): {setup}")
    return proc


def kill(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def sandbox(hostname: str | None, memory: list[tuple[Path, int, int | None]]) -> subprocess.Popen:
    """The pod's sandbox: network + UTS namespaces unless hostname is None (the pod joins another pod's),
    and a mount namespace holding its memory emptyDirs (folder, bytes, fsGroup) as tmpfs of that size."""
    setup = []
    for folder, size, group in memory:
        opts = f"size={size},mode={'2775' if group is not None else '1777'}"
        setup.append(
            f"mount -t tmpfs -o {opts}{f',gid={group}' if group is not None else ''} lpx-emptydir {folder}"
        )
    flags = ["--mount"]
    if hostname is not None:
        flags += ["--net", "--uts"]
        setup += [f"hostname {hostname}", "ip link set lo up"]
    proc = holder(flags, setup)
    if hostname is not None and not in_netns(proc.pid, lo_up):
        kill(proc)
        raise NetworkFailure("the pod's loopback carries no connection")
    return proc


@dataclass
class Record:
    """What the kubelet and a headless Service know of one pod: its address and names."""

    ip: str
    hostname: str
    subdomain: str | None
    namespace: str

    def names(self, own: bool) -> list[str]:
        if self.subdomain is None:
            return [self.hostname] if own else []
        sub = f"{self.hostname}.{self.subdomain}"
        names = [f"{sub}.{self.namespace}.svc.cluster.local", f"{sub}.{self.namespace}", sub]
        return names + ([self.hostname] if own else [])


def hosts_file(own: Record | None, others: list[Record]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for r, is_own in [(own, True)] * (own is not None) + [(o, False) for o in others]:
        if r.names(is_own):
            lines.append(f"{r.ip}\t{' '.join(r.names(is_own))}")
    return "\n".join(lines) + "\n"


def resolv_conf(namespace: str) -> str:
    """The kubelet's resolv.conf for a ClusterFirst pod, without the cluster DNS server (there is none)."""
    return f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"


class ClusterNetwork:
    """A bridge in a network namespace of its own; attach() gives a pod an eth0 on it (a veth pair)."""

    def __init__(self) -> None:
        self.proc = holder(
            ["--net"], ["ip link set lo up", "ip link add lpx0 type bridge", "ip link set lpx0 up"]
        )
        self.attached = 0

    def attach(self, net_pid: int) -> str:
        self.attached += 1
        n, ip = self.attached, f"{POD_CIDR}.{self.attached + 1}"
        outside = f"ip link add veth{n} type veth peer name eth0 netns /proc/{net_pid}/ns/net"
        steps = [
            (self.proc.pid, f"{outside} && ip link set veth{n} master lpx0 && ip link set veth{n} up"),
            (net_pid, f"ip addr add {ip}/24 dev eth0 && ip link set eth0 up"),
        ]
        for pid, cmd in steps:
            res = subprocess.run(
                ["nsenter", f"--net=/proc/{pid}/ns/net", "sh", "-c", cmd], capture_output=True, text=True
            )
            if res.returncode != 0:
                raise NetworkFailure(f"{cmd}: {res.stderr.strip()}")
        return ip

    def stop(self) -> None:
        kill(self.proc)


def kill_namespace(pid: int) -> None:
    """SIGKILL every process in the network namespace of `pid` but that one (the kubelet stops a pod's
    processes by its cgroup; sshd's session children leave the container's process group)."""
    ns = os.readlink(f"/proc/{pid}/ns/net")
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (pid, os.getpid()):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == ns:
                    os.kill(int(entry), signal.SIGKILL)


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
