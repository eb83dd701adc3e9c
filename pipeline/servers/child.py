"""The child processes LPX starts and supervises - tritonserver, the OpenAI gateway, trtllm-build - written
once: each runs in a session (process group) of its own, so it and everything it spawns (Triton's python
stubs, mpirun's ranks) is stopped together; it is SIGTERM'd when the process that started it dies, even by
SIGKILL, so a killed `lpx serve` or test never leaves a server holding ports and /dev/shm; its output goes
to a log file whose tail an error shows. And the ports: free ones picked, busy ones seen."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

LOG_TAIL_LINES = 30
# With echo, the child's output goes to stdout (a pod's `kubectl logs`) and its log file keeps this much, for
# the error tail and the known-abort check; a log volume of fixed size never fills
ECHO_FILE_CAP = 64 << 20


def die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (PR_SET_PDEATHSIG; Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the child outlives a killed parent, as before
        pass


def spawn(
    argv: Sequence[str],
    log_path: Path | None,
    env: dict[str, str] | None = None,
    append: bool = False,
    echo: bool = False,
) -> subprocess.Popen:
    """Start `argv` in a session of its own that dies with this process, stdin closed, stdout and stderr
    into `log_path` (appended to with `append`; with `echo` also copied to this process's stdout, the file
    capped at ECHO_FILE_CAP), or, when `log_path` is None, into a pipe of text lines the caller reads
    (undecodable bytes replaced)."""
    kwargs = dict(stdin=subprocess.DEVNULL, env=env, start_new_session=True, preexec_fn=die_with_parent)
    if log_path is None:
        pipe = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        return subprocess.Popen(list(argv), **pipe, **kwargs)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if echo:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
        copy = threading.Thread(
            target=_tee, args=(proc.stdout, log_path, append), name="child-log", daemon=True
        )
        copy.start()
        return proc
    with open(log_path, "ab" if append else "wb") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, **kwargs)


def _tee(stream, log_path: Path, append: bool) -> None:
    """Copy a child's output line by line to stdout and to `log_path` (up to ECHO_FILE_CAP bytes)."""
    written = 0
    with open(log_path, "ab" if append else "wb") as log:
        for line in iter(stream.readline, b""):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            if written < ECHO_FILE_CAP:
                log.write(line)
                log.flush()
                written += len(line)
                if written >= ECHO_FILE_CAP:
                    log.write(
                        b"[lpx: this file stops here (ECHO_FILE_CAP); the rest of the log is on stdout]\n"
                    )
                    log.flush()


def kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process of the group and wait (bounded) until none is left."""
    deadline = time.monotonic() + wait_s
    try:
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)
            time.sleep(0.05)
    except (ProcessLookupError, PermissionError):  # the group is gone
        pass


def stop(proc: subprocess.Popen, grace_s: float, whole_group: bool = False) -> int | None:
    """SIGTERM the child (its whole group with `whole_group`: a tool that does not pass signals on), give it
    `grace_s` to exit, then SIGKILL what is left of its group and reap it. Its exit code."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM) if whole_group else proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid)  # a hung leader, or stubs / ranks left in the group
    return proc.wait()


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a child's log without Triton's tables, after any earlier error lines."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace") if path else ""
    except OSError:
        return ""
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("+", "|"))]
    errors = [ln for ln in kept[:-lines] if ln.startswith("E") or "Error" in ln or "error:" in ln][-10:]
    return "\n".join(errors + (["..."] if errors else []) + kept[-lines:])


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_free(host: str, port: int) -> bool:
    """True if nothing listens on host:port (TIME_WAIT leftovers do not count)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, n: int) -> list[int]:
    """`n` distinct ports free on `host` now (bound together, then released)."""
    socks = [socket.socket(_family(host), socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def hostport(host: str, port: int) -> str:
    """host:port for a client: a wildcard bind address becomes loopback, IPv6 gets brackets."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
