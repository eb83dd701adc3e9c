"""Run a real `tritonserver` on a model repository: pick ports, start, wait for ready, stop cleanly (its
process group killed, its /dev/shm regions removed), or serve until SIGINT/SIGTERM. Which binary and
environment is binary.py's; the MPI command line for several ranks is ranks.py's.

One failure is retried: tritonserver aborting while it loads the python models with boost::interprocess's
lock_exception (Triton server #8882, tensorrtllm_backend #521: seen under heavy load, gone on a second
start). Such a start is restarted once, saying so; any other failure, or the same one twice, is reported."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from ..artifacts import home
from ..errors import LpxError, NotFound, StageFailed
from . import child
from .binary import bundled_env, find_tritonserver, is_bundled, private_backends
from .child import free_ports, hostport, log_tail, port_free, spawn
from .ranks import find_mpirun, mpi_command

CONTAINER_BIN = Path("/opt/tritonserver/bin/tritonserver")
INSTALL_FIX = (
    "install it with \"pip install 'lpx[triton]'\" or run LPX inside the NGC Triton TensorRT-LLM container"
)


# The python backend's shared-memory lock failing (the C++ runtime's "terminate called after throwing an
# instance of 'boost::interprocess::lock_exception'" and its "what():" line), or another boost::interprocess
# error that names a lock or mutex. Nothing else is restarted.
LOCK_ABORT = re.compile(
    r"boost::interprocess::lock_exception|boost::interprocess\S*.*\b(lock|mutex)", re.IGNORECASE
)


def known_load_abort(log_text: str) -> str | None:
    """The first line of a tritonserver log that shows the known transient abort while loading
    (boost::interprocess's lock_exception), or None for any other failure."""
    for line in log_text.splitlines():
        if LOCK_ABORT.search(line):
            return line.strip()
    return None


def _stderr_notice(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class TritonServer:
    """A tritonserver child process on `repo`, bound to `host`; port 0 picks a free port.

    world_size > 1 (an engine built with tp_size x pp_size GPUs) runs one rank per GPU under mpirun
    (see mpi_command); rank 0 serves.
    """

    def __init__(
        self,
        repo: Path,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        log_path: Path | None = None,
        ready_timeout_s: float = 180.0,
        extra_args: tuple[str, ...] | list[str] = (),
        exit_timeout_s: int = 10,
        world_size: int = 1,
        notify: Callable[[str], None] | None = None,
        echo: bool = False,
    ):
        self.echo = echo  # its log on stdout too (a pod: kubectl logs), the file capped
        self.world_size = int(world_size)
        self.notify = notify or _stderr_notice
        self.repo = Path(repo)
        self.host = host
        self._requested = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self._ports = dict(self._requested)
        self.log_path = Path(log_path) if log_path else None
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = list(extra_args)
        self.exit_timeout_s = exit_timeout_s
        self.shm_prefix = f"lpx{os.getpid()}_{secrets.token_hex(3)}_"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- addresses ------------------------------------------------------------------------------
    @property
    def ports(self) -> dict[str, int]:
        return dict(self._ports)

    @property
    def http_url(self) -> str:
        return hostport(self.host, self._ports["http"])

    @property
    def grpc_url(self) -> str:
        return hostport(self.host, self._ports["grpc"])

    @property
    def metrics_url(self) -> str:
        return hostport(self.host, self._ports["metrics"])

    # -- lifecycle ------------------------------------------------------------------------------
    def command(self, binary: Path, backends: Path | None) -> list[str]:
        log_dir = self.log_path.parent if self.log_path else home() / "triton" / "logs"
        cmd = mpi_command(
            binary,
            self.repo,
            self.world_size,
            self.host,
            self._ports,
            self.shm_prefix,
            log_dir,
            backends=backends,
            exit_timeout_s=self.exit_timeout_s,
        )
        if self.world_size == 1 or not self.extra_args:
            return cmd + self.extra_args
        first = cmd.index(":")  # extra arguments go to the serving rank
        return cmd[:first] + self.extra_args + cmd[first:]

    def preflight(self) -> Path:
        """What can fail before any work: the tritonserver binary and explicitly given ports."""
        for name, port in self._requested.items():
            if port and not port_free(self.host, port):
                raise LpxError(
                    f"Port {port} on {self.host} is already in use - stop what holds it "
                    f"or set serving.{name}_port to another port (0 picks a free one)"
                )
        binary = find_tritonserver()
        if self.world_size > 1:
            find_mpirun()
        return binary

    def start(self) -> TritonServer:
        """Launch and wait until /v2/health/ready answers 200; LpxError with the log tail if not. A start
        that aborts while loading with the known boost::interprocess lock failure is restarted once."""
        if self.proc is not None:
            return self
        if not self.repo.is_dir():
            raise NotFound(f"Model repository {self.repo} does not exist - run 'lpx repo' first")
        binary = self.preflight()
        abort = self._attempt(binary, restartable=True)
        if abort is not None:
            kept = self._keep_log()
            self.notify(
                f"tritonserver aborted while loading {self.repo} with a known transient Triton failure "
                f"({abort!r}; Triton server issue #8882) - restarting it once (first log: {kept})"
            )
            self.shm_prefix = f"lpx{os.getpid()}_{secrets.token_hex(3)}_"
            self._attempt(binary, restartable=False)
        return self

    def _attempt(self, binary: Path, restartable: bool) -> str | None:
        """One launch: None once ready; the log's abort line if it exited while loading with the known
        lock failure and `restartable` (the server is stopped then); else the failure is raised."""
        self._launch(binary)
        try:
            self._wait_ready()
        except StageFailed as exc:
            exited = self.proc is not None and self.proc.poll() is not None
            self.stop()
            line = known_load_abort(_read(self.log_path)) if exited else None
            if line is None:
                raise
            if restartable:
                return line
            raise StageFailed(
                f"tritonserver aborted again while loading {self.repo} after one restart ({line!r}; Triton "
                "server issue #8882, seen under heavy load) - retry when the machine is less busy; see its "
                f"log ({self.log_path})",
                detail=exc.detail,
            ) from None
        except BaseException:
            self.stop()
            raise
        return None

    def _launch(self, binary: Path) -> None:
        free = iter(free_ports(self.host, sum(1 for p in self._requested.values() if not p)))
        self._ports = {k: (p or next(free)) for k, p in self._requested.items()}
        root = is_bundled(binary)
        env = bundled_env(root) if root else None
        if self.world_size > 1:  # leader mode: orchestrator mode would spawn its own workers (mpi_command)
            env = dict(env if env is not None else os.environ)
            env.pop("TRTLLM_ORCHESTRATOR", None)
        backends = private_backends(root) if root else None
        if self.log_path is None:
            self.log_path = home() / "triton" / "logs" / f"tritonserver-{self.shm_prefix.rstrip('_')}.log"
        self.proc = spawn(self.command(binary, backends), self.log_path, env, echo=self.echo)

    def _keep_log(self) -> Path:
        """Move the aborted attempt's log aside (the restart writes a new one); returns where it went."""
        assert self.log_path is not None
        kept = self.log_path.with_name(f"{self.log_path.stem}.first-attempt{self.log_path.suffix}")
        os.replace(self.log_path, kept)
        return kept

    def _wait_ready(self) -> None:
        assert self.proc is not None
        url = f"http://{self.http_url}/v2/health/ready"
        probe = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via http_proxy
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise StageFailed(
                    f"tritonserver exited with code {code} while loading {self.repo} - "
                    f"fix the error in its log ({self.log_path})",
                    detail=log_tail(self.log_path),
                )
            try:
                with probe.open(url, timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise StageFailed(
                    f"tritonserver not ready after {self.ready_timeout_s:.0f} s - see its log "
                    f"({self.log_path}) or raise the ready timeout",
                    detail=log_tail(self.log_path),
                )
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL the process group if needed, remove our leaked /dev/shm regions."""
        proc, self.proc = self.proc, None
        if proc is not None:
            child.stop(proc, grace_s=self.exit_timeout_s + 5)  # stubs or a hung server: the group killed
        for leaked in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            leaked.unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _read(path: Path | None) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace") if path else ""
    except OSError:
        return ""


def serve_forever(server: TritonServer, poll_s: float = 0.5, also=None) -> None:
    """Block until SIGINT/SIGTERM (then return) or until Triton - or `also` (the OpenAI gateway's
    process, with alive() and log_path) - dies (then LpxError)."""
    stop = threading.Event()
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            if not server.alive():
                code = server.proc.returncode if server.proc is not None else None
                raise StageFailed(
                    f"tritonserver stopped unexpectedly (exit code {code}) - see its log ({server.log_path})",
                    detail=log_tail(server.log_path) if server.log_path else None,
                )
            if also is not None and not also.alive():
                raise StageFailed(
                    f"The OpenAI gateway stopped unexpectedly - see its log ({also.log_path})",
                    detail=log_tail(also.log_path),
                )
            stop.wait(poll_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
