"""Run a real `tritonserver` on a model repository: start, wait for ready, stop cleanly.

Works with the NGC container's /opt/tritonserver and with the server bundled in the
`nvidia-pytriton` wheel; the latter needs a private backends folder with the stub that matches
this Python, the venv first on PATH and the matching libpython on LD_LIBRARY_PATH; this module sets all three.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from ...artifacts import home
from ...errors import PipelineError

CONTAINER_BIN = Path("/opt/tritonserver/bin/tritonserver")
INSTALL_FIX = (
    "install it with \"pip install 'lpx[triton]'\" or run LPX inside the NGC Triton TensorRT-LLM container"
)
LOG_TAIL_LINES = 30


def bundled_root() -> Path | None:
    """`site-packages/pytriton/tritonserver` of the nvidia-pytriton wheel, if installed."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


def find_tritonserver() -> Path:
    """The tritonserver binary: PATH, then the NGC container's, then nvidia-pytriton's."""
    found = shutil.which("tritonserver")
    if found:
        return Path(found)
    if CONTAINER_BIN.is_file():
        return CONTAINER_BIN
    root = bundled_root()
    if root is not None:
        return root / "bin" / "tritonserver"
    raise PipelineError(
        f"tritonserver not found (looked in PATH, {CONTAINER_BIN}, nvidia-pytriton): {INSTALL_FIX}"
    )


def _is_bundled(binary: Path) -> Path | None:
    """The wheel's tritonserver folder if `binary` is the one bundled in nvidia-pytriton."""
    root = binary.resolve().parent.parent
    if root.name == "tritonserver" and root.parent.name == "pytriton" and (root / "backends").is_dir():
        return root
    return None


def private_backends(root: Path) -> Path:
    """Copy the wheel's backends once into LPX_HOME, with this Python's stub beside the backend."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise PipelineError(
            f"nvidia-pytriton has no python backend stub for Python {ver}: use Python 3.8-3.13"
        )
    st = stub.stat()
    key = hashlib.sha256(f"{root.resolve()}|{ver}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    dest = home() / "triton" / f"backends-{key}"
    if (dest / "python" / "triton_python_backend_stub").is_file():
        return dest
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(root / "backends", tmp, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
    try:
        os.rename(tmp, dest)
    except OSError:  # another process won the race: its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def bundled_env(root: Path) -> dict[str, str]:
    """Environment for the wheel's server: venv first on PATH, matching libpython + bundled libs."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")]).rstrip(os.pathsep)
    libs = [str(sysconfig.get_config_var("LIBDIR") or ""), str(root.parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([p for p in libs + [env.get("LD_LIBRARY_PATH", "")] if p])
    return env


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


def _pick_ports(host: str, n: int) -> list[int]:
    socks = [socket.socket(_family(host), socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _hostport(host: str, port: int) -> str:
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last `lines` lines of Triton's log without its tables, after any earlier error lines."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("+", "|"))]
    errors = [ln for ln in kept[:-lines] if ln.startswith("E") or "Error" in ln or "error:" in ln][-10:]
    return "\n".join(errors + (["..."] if errors else []) + kept[-lines:])


def _kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process of the group and wait (bounded) until none is left."""
    deadline = time.monotonic() + wait_s
    try:
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)
            time.sleep(0.05)
    except (ProcessLookupError, PermissionError):
        pass


MPI_FIX = (
    "install Open MPI (mpirun on PATH; the NGC Triton TensorRT-LLM container ships it) "
    "or serve an engine built with tp_size x pp_size = 1"
)


def find_mpirun() -> Path:
    found = shutil.which("mpirun")
    if not found:
        raise PipelineError(
            f"mpirun not found: serving a multi-GPU engine runs one Triton rank per GPU under MPI - {MPI_FIX}"
        )
    return Path(found)


def rank0_args(
    repo: Path,
    host: str,
    ports: dict[str, int],
    shm_prefix: str,
    exit_timeout_s: int = 10,
    backends: Path | None = None,
) -> list[str]:
    """The serving rank (and the only one when world_size is 1): every model, HTTP/gRPC/metrics on `host`."""
    args = [
        f"--model-repository={repo}",
        "--model-control-mode=none",
        f"--http-address={host}",
        f"--http-port={ports['http']}",
        f"--grpc-address={host}",
        f"--grpc-port={ports['grpc']}",
        f"--metrics-address={host}",
        f"--metrics-port={ports['metrics']}",
        f"--exit-timeout-secs={exit_timeout_s}",
        "--log-verbose=0",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
    ]
    return args + ([f"--backend-directory={backends}"] if backends is not None else [])


def mpi_command(
    binary: Path,
    repo: Path,
    world_size: int,
    host: str,
    ports: dict[str, int],
    shm_prefix: str,
    log_dir: Path,
    *,
    backends: Path | None = None,
    exit_timeout_s: int = 10,
    mpirun: Path | None = None,
) -> list[str]:
    """The command that serves `repo` with one Triton rank per GPU (plain tritonserver when world_size is 1).

    Leader mode of the tensorrtllm backend, as upstream's scripts/launch_triton_server.py composes it
    (triton-inference-server/tensorrtllm_backend, read through the `code` corpus, 2026-12-02): one
    `mpirun` with an MPMD block `-n 1 tritonserver ... :` per rank, `--allow-run-as-root` (newer
    versions only as root), `--disable-auto-complete-config` and `--backend-config=python,
    shm-region-prefix-name=prefix{rank}_` on every rank; ranks other than 0 get
    `--model-control-mode=explicit --load-model=tensorrt_llm`, and NVIDIA's launchers (triton_cli,
    the same script's later versions) also give them `--allow-http=false --allow-grpc=false
    --allow-metrics=false`. The non-zero ranks' tensorrtllm backend becomes an MPI worker of rank 0's
    executor, so no executor worker path is needed: that (`executor_worker_path`, default
    /opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker) is only read in orchestrator mode
    (`--multi-model`, env TRTLLM_ORCHESTRATOR=1, which upstream allows only with world_size 1 and
    which TritonServer removes from the environment of a multi-rank launch).
    Rank 0 logs to mpirun's stdout (the server's log file); rank N to `log_dir/triton-rank{N}.log`.
    """
    if world_size < 1:
        raise PipelineError(
            f"world_size must be at least 1, not {world_size} - check build.tp_size and build.pp_size"
        )
    common = [f"--backend-directory={backends}"] if backends is not None else []
    if world_size == 1:
        return [str(binary), *rank0_args(repo, host, ports, shm_prefix, exit_timeout_s, backends)]
    cmd = [str(mpirun or find_mpirun())]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for rank in range(world_size):
        prefix = f"{shm_prefix}prefix{rank}_"
        cmd += ["-n", "1", str(binary)]
        if rank == 0:
            cmd += rank0_args(repo, host, ports, prefix, exit_timeout_s, backends)
        else:
            cmd += [
                f"--model-repository={repo}",
                "--model-control-mode=explicit",
                "--load-model=tensorrt_llm",
                "--allow-http=false",
                "--allow-grpc=false",
                "--allow-metrics=false",
                # never used while disabled; set so that no rank could ever listen on 0.0.0.0
                f"--http-address={host}",
                f"--grpc-address={host}",
                f"--metrics-address={host}",
                f"--exit-timeout-secs={exit_timeout_s}",
                "--log-verbose=0",
                f"--log-file={Path(log_dir) / f'triton-rank{rank}.log'}",
                f"--backend-config=python,shm-region-prefix-name={prefix}",
                *common,
            ]
        cmd += ["--disable-auto-complete-config"]
        if rank < world_size - 1:
            cmd.append(":")
    return cmd


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
    ):
        self.world_size = int(world_size)
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
        return _hostport(self.host, self._ports["http"])

    @property
    def grpc_url(self) -> str:
        return _hostport(self.host, self._ports["grpc"])

    @property
    def metrics_url(self) -> str:
        return _hostport(self.host, self._ports["metrics"])

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
                raise PipelineError(
                    f"Port {port} on {self.host} is already in use - stop what holds it "
                    f"or set serving.{name}_port to another port (0 picks a free one)"
                )
        binary = find_tritonserver()
        if self.world_size > 1:
            find_mpirun()
        return binary

    def start(self) -> TritonServer:
        """Launch and wait until /v2/health/ready answers 200; PipelineError with the log tail if not."""
        if self.proc is not None:
            return self
        if not self.repo.is_dir():
            raise PipelineError(f"Model repository {self.repo} does not exist - run 'lpx repo' first")
        binary = self.preflight()
        free = iter(_pick_ports(self.host, sum(1 for p in self._requested.values() if not p)))
        self._ports = {k: (p or next(free)) for k, p in self._requested.items()}
        root = _is_bundled(binary)
        env = bundled_env(root) if root else None
        if self.world_size > 1:  # leader mode: orchestrator mode would spawn its own workers (mpi_command)
            env = dict(env if env is not None else os.environ)
            env.pop("TRTLLM_ORCHESTRATOR", None)
        backends = private_backends(root) if root else None
        if self.log_path is None:
            self.log_path = home() / "triton" / "logs" / f"tritonserver-{self.shm_prefix.rstrip('_')}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(binary, backends),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        url = f"http://{self.http_url}/v2/health/ready"
        probe = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via http_proxy
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise PipelineError(
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
                raise PipelineError(
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
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=self.exit_timeout_s + 5)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(proc.pid)  # stubs or a hung server left in the group
            proc.wait()
        for leaked in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            leaked.unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies, even by SIGKILL,
    so a killed 'lpx serve' or test never leaves a tritonserver holding ports and /dev/shm (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve_forever(server: TritonServer, poll_s: float = 0.5) -> None:
    """Block until SIGINT/SIGTERM (then return) or until Triton dies (then PipelineError)."""
    stop = threading.Event()
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            if not server.alive():
                code = server.proc.returncode if server.proc is not None else None
                raise PipelineError(
                    f"tritonserver stopped unexpectedly (exit code {code}) - see its log ({server.log_path})",
                    detail=log_tail(server.log_path) if server.log_path else None,
                )
            stop.wait(poll_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
