"""One Triton rank per GPU: the command line that serves an engine built for tp_size x pp_size GPUs under
MPI (plain tritonserver when that is 1), and the arguments of the serving rank."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..errors import NotFound, UsageError

MPI_FIX = (
    "install Open MPI (mpirun on PATH; the NGC Triton TensorRT-LLM container ships it) "
    "or serve an engine built with tp_size x pp_size = 1"
)


def find_mpirun() -> Path:
    found = shutil.which("mpirun")
    if not found:
        raise NotFound(
            f"mpirun not found: serving a multi-GPU engine runs one Triton rank per GPU under MPI - {MPI_FIX}"
        )
    return Path(found)


def mpi_hosts(world_size: int, env: dict[str, str] | None = None) -> list[str]:
    """`-H` entries (host:slots) when the ranks span several machines, else []: LPX_MPI_HOSTS
    ("h1:8,h2:8") as given, or, in a LeaderWorkerSet pod, the group derived from what the controller
    sets: LWS_LEADER_ADDRESS (<name>-<group>.<name>.<ns>...), LWS_GROUP_SIZE; worker i is
    <name>-<group>-<i> under the same subdomain. Slots per host: world_size / group size."""
    env = dict(os.environ if env is None else env)
    if env.get("LPX_MPI_HOSTS"):
        return [h.strip() for h in env["LPX_MPI_HOSTS"].split(",") if h.strip()]
    leader, size = env.get("LWS_LEADER_ADDRESS"), env.get("LWS_GROUP_SIZE")
    if not leader or not size or int(size) < 2:
        return []
    group = int(size)
    if world_size % group:
        raise UsageError(
            f"{world_size} ranks do not split evenly over a group of {group} pods - set "
            "deploy.gpus_per_node to a divisor of tp_size x pp_size"
        )
    first, _, rest = leader.partition(".")
    slots = world_size // group
    hosts = [leader] + [f"{first}-{i}.{rest}" if rest else f"{first}-{i}" for i in range(1, group)]
    return [f"{h}:{slots}" for h in hosts]


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
        # latency quantiles per model (nv_inference_request_summary_us): lpx top's end-to-end p50/p99
        "--metrics-config=summary_latencies=true",
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
        raise UsageError(
            f"world_size must be at least 1, not {world_size} - check build.tp_size and build.pp_size"
        )
    if world_size == 1:
        return [str(binary), *rank0_args(repo, host, ports, shm_prefix, exit_timeout_s, backends)]
    cmd = [str(mpirun or find_mpirun())]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    hosts = mpi_hosts(world_size)
    if hosts:  # ranks on several machines (a LeaderWorkerSet group), started over SSH
        # No ssh options here: Open MPI takes a command-line MCA parameter over the environment, so a
        # `--mca plm_rsh_args` would hide the pod's OMPI_MCA_plm_rsh_args (port, key, known_hosts;
        # pipeline/deploy/mpi.py owns them) and ssh would try port 22 without the Secret's key.
        cmd += ["-H", ",".join(hosts)]
    for rank in range(world_size):
        prefix = f"{shm_prefix}prefix{rank}_"
        cmd += ["-n", "1", str(binary)]
        if rank == 0:
            cmd += rank0_args(repo, host, ports, prefix, exit_timeout_s, backends)
        else:
            cmd += worker_args(repo, host, rank, prefix, log_dir, exit_timeout_s, backends)
        cmd += ["--disable-auto-complete-config"]
        if rank < world_size - 1:
            cmd.append(":")
    return cmd


def worker_args(
    repo: Path,
    host: str,
    rank: int,
    shm_prefix: str,
    log_dir: Path,
    exit_timeout_s: int = 10,
    backends: Path | None = None,
) -> list[str]:
    """A rank other than 0: loads only tensorrt_llm (an MPI worker of rank 0's executor), serves no HTTP,
    gRPC or metrics, and logs to `log_dir/triton-rank{rank}.log`."""
    return [
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
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        *([f"--backend-directory={backends}"] if backends is not None else []),
    ]
