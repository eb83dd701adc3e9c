#!/usr/bin/env python3
"""A stand-in for tritonserver as one rank of the engine target's mpirun (tests/test_pods_mpi.py): TensorRT-LLM
and GPUs cannot run here, so this program takes the rank's place in the MPMD command `ranks.mpi_command`
composes, and reports what the rank was given, as JSON in $LPX_HOME/standin-rank<N>.json of its own pod and, where
`--log-file=` names a folder that exists, in that file too (tritonserver logs a rank other than 0 there;
it falls back to stderr when the file cannot be opened), and one short line on stdout, which mpirun
forwards to the leader (long lines of several ranks may interleave there):
its rank, host and network namespace, its tritonserver arguments, and the environment an MPI rank of
TensorRT-LLM reads: OMPI_COMM_WORLD_RANK / SIZE / LOCAL_RANK / LOCAL_SIZE (what MPI's rank, size and
per-host split give it), CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES (the GPUs its local rank picks
from), PATH, LD_LIBRARY_PATH, LPX_HOME, HOME and the NCCL_ / UCX_ / OMPI_MCA_ settings.

    standin_rank.py launch WORLD [MPIRUN_ARG...]
        in the leader's container: exec the mpirun command that `lpx serve` composes there
        (ranks.mpi_command, this file as the binary, the hosts derived from the pod's LWS_* variables),
        MPIRUN_ARGs inserted after mpirun (a test replays an older command line)
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

KEYS = ("PATH", "LD_LIBRARY_PATH", "LPX_HOME", "HOME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
PREFIXES = ("OMPI_COMM_WORLD_", "NCCL_", "UCX_", "OMPI_MCA_")


def report(args: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k in KEYS or k.startswith(PREFIXES)}
    return {
        "rank": int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1")),
        "host": socket.gethostname(),
        "netns": os.readlink("/proc/self/ns/net"),
        "uid": os.getuid(),
        "args": args,
        "env": env,
    }


def launch(world: int, extra: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipeline.deploy.k8s import LPX_HOME, PORTS
    from pipeline.servers.ranks import mpi_command

    ports = {k: PORTS[k] for k in ("http", "grpc", "metrics")}
    logs = Path(os.environ.get("LPX_HOME", LPX_HOME)) / "logs"
    logs.mkdir(parents=True, exist_ok=True)  # as `lpx serve` makes it on the leader (served.server)
    cmd = mpi_command(Path(__file__).resolve(), Path("/models"), world, "0.0.0.0", ports, "lpx_", logs)
    cmd[1:1] = extra
    print("mpirun:", json.dumps(cmd), flush=True)
    os.execv(cmd[0], cmd)


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:
        launch(int(argv[1]), argv[2:])
    r = report(argv)
    line = json.dumps(r)
    Path(os.environ["LPX_HOME"], f"standin-rank{r['rank']}.json").write_text(line)
    print(f"standin rank {r['rank']} on {r['host']}", flush=True)
    for a in argv:
        if a.startswith("--log-file="):
            log = Path(a.split("=", 1)[1])
            if log.parent.is_dir():
                log.write_text(line + "\n")
            else:
                print(f"cannot open log file {log}: logging to stderr", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
