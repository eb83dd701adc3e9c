"""The multi-GPU serving command: one Triton rank per GPU under mpirun (no GPU, no mpirun needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.errors import LpxError
from pipeline.served import world_size
from pipeline.servers import ranks as mpi
from pipeline.servers import tritonserver as serve

BIN = Path("/opt/tritonserver/bin/tritonserver")
REPO = Path("/models/repo")
PORTS = {"http": 18000, "grpc": 18001, "metrics": 18002}
MPIRUN = Path("/usr/bin/mpirun")


def ranks(cmd: list[str]) -> list[list[str]]:
    """Split an mpirun MPMD command into each rank's tritonserver arguments (after `-n 1 BIN`)."""
    assert cmd[0] == str(MPIRUN)
    blocks, cur = [], None
    for i, arg in enumerate(cmd):
        if arg == str(BIN):
            assert cmd[i - 2 : i] == ["-n", "1"]
            cur = []
            blocks.append(cur)
        elif arg == ":":
            cur = None
        elif cur is not None:
            cur.append(arg)
    return blocks


def compose(n: int, host: str = "127.0.0.1", tmp: Path = Path("/tmp/logs")) -> list[str]:
    return mpi.mpi_command(BIN, REPO, n, host, PORTS, "lpx1_ab_", tmp, mpirun=MPIRUN)


def flag(args: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]


def test_world_size_1_is_plain_tritonserver() -> None:
    cmd = compose(1)
    assert cmd[0] == str(BIN) and "mpirun" not in " ".join(cmd)
    assert "--model-control-mode=none" in cmd and not flag(cmd, "load-model")
    assert (
        flag(cmd, "http-address")
        == flag(cmd, "grpc-address")
        == flag(cmd, "metrics-address")
        == ["127.0.0.1"]
    )
    assert flag(cmd, "http-port") == ["18000"] and flag(cmd, "grpc-port") == ["18001"]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_rank0_serves_everything_other_ranks_load_only_the_engine(n: int, host: str, monkeypatch) -> None:
    monkeypatch.setattr(mpi.os, "geteuid", lambda: 1000)
    cmd = compose(n, host)
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    blocks = ranks(cmd)
    assert len(blocks) == n and cmd.count(":") == n - 1 and cmd[-1] != ":"
    zero, others = blocks[0], blocks[1:]
    assert "--model-control-mode=none" in zero and not flag(zero, "load-model")
    assert flag(zero, "http-port") == ["18000"] and flag(zero, "grpc-port") == ["18001"]
    assert flag(zero, "metrics-port") == ["18002"]
    assert flag(zero, "metrics-config") == ["summary_latencies=true"], "lpx top's end-to-end quantiles"
    for args in blocks:
        assert flag(args, "model-repository") == [str(REPO)]
        assert "--disable-auto-complete-config" in args
        for kind in ("http", "grpc", "metrics"):  # every rank is told the address: none falls back to 0.0.0.0
            assert flag(args, f"{kind}-address") == [host]
    for rank, args in enumerate(others, start=1):
        assert "--model-control-mode=explicit" in args and flag(args, "load-model") == ["tensorrt_llm"]
        assert {"--allow-http=false", "--allow-grpc=false", "--allow-metrics=false"} <= set(args)
        assert not flag(args, "http-port") and not flag(args, "grpc-port") and not flag(args, "metrics-port")
        assert flag(args, "log-file") == [f"/tmp/logs/triton-rank{rank}.log"]
    prefixes = [flag(a, "backend-config")[0] for a in blocks]
    assert prefixes == [f"python,shm-region-prefix-name=lpx1_ab_prefix{r}_" for r in range(n)]
    assert len(set(prefixes)) == n


def test_run_as_root_only_as_root(monkeypatch) -> None:
    monkeypatch.setattr(mpi.os, "geteuid", lambda: 0)
    cmd = compose(2)
    assert cmd[:2] == [str(MPIRUN), "--allow-run-as-root"] and cmd[2:4] == ["-n", "1"]


def test_lws_group_ranks_take_ssh_options_from_the_pod_env_only(monkeypatch) -> None:
    """In a LeaderWorkerSet group mpirun gets the hosts (-H) and no MCA parameter: Open MPI takes a
    command-line `--mca plm_rsh_args` over OMPI_MCA_plm_rsh_args, so the old `--mca plm_rsh_args "-p 2222"`
    hid the leader env's key, known_hosts and BatchMode from ssh. The env is the one place for them, and it
    carries the workers' sshd port (tests/test_pods_mpi.py runs it through a real mpirun and sshd)."""
    from pipeline.deploy import mpi as deploy_mpi

    monkeypatch.setenv("LWS_LEADER_ADDRESS", "lpx-0.lpx.ns")
    monkeypatch.setenv("LWS_GROUP_SIZE", "2")
    cmd = compose(4)
    assert cmd[cmd.index("-H") + 1] == "lpx-0.lpx.ns:2,lpx-0-1.lpx.ns:2"
    assert "--mca" not in cmd and not [a for a in cmd if "plm_rsh" in a]
    env = {e["name"]: e["value"] for e in deploy_mpi.leader_env()}
    assert f"-p {deploy_mpi.SSH_PORT} " in env["OMPI_MCA_plm_rsh_args"]
    assert "BatchMode=yes" in env["OMPI_MCA_plm_rsh_args"]
    # Open MPI cuts host names at the first dot unless told: <lws>-0-1 has no DNS record in a cluster
    assert env["OMPI_MCA_orte_keep_fqdn_hostnames"] == "1"


def test_mpirun_missing_is_a_clear_error(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(mpi.shutil, "which", lambda name: None)
    with pytest.raises(LpxError, match="mpirun not found.*install Open MPI"):
        mpi.mpi_command(BIN, REPO, 2, "127.0.0.1", PORTS, "p_", tmp_path)
    assert mpi.mpi_command(BIN, REPO, 1, "127.0.0.1", PORTS, "p_", tmp_path)[0] == str(BIN)
    # TritonServer says so in preflight, before anything is started
    monkeypatch.setattr(serve, "find_tritonserver", lambda: BIN)
    with pytest.raises(LpxError, match="mpirun not found"):
        serve.TritonServer(tmp_path, world_size=2).preflight()
    assert serve.TritonServer(tmp_path).preflight() == BIN
    with pytest.raises(LpxError, match="world_size must be at least 1"):
        mpi.mpi_command(BIN, REPO, 0, "127.0.0.1", PORTS, "p_", tmp_path)


def test_server_command_uses_ranks_and_keeps_extra_args_on_rank0(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(mpi.shutil, "which", lambda name: str(MPIRUN) if name == "mpirun" else None)
    srv = serve.TritonServer(
        tmp_path, host="127.0.0.1", log_path=tmp_path / "t.log", world_size=2, extra_args=["--log-verbose=1"]
    )
    srv._ports = dict(PORTS)
    blocks = ranks(srv.command(BIN, None))
    assert "--log-verbose=1" in blocks[0] and "--log-verbose=1" not in blocks[1]
    assert flag(blocks[1], "log-file") == [str(tmp_path / "triton-rank1.log")]
    assert all(
        flag(b, "backend-config")[0].endswith(f"{srv.shm_prefix}prefix{r}_") for r, b in enumerate(blocks)
    )
    single = serve.TritonServer(tmp_path, world_size=1)
    single._ports = dict(PORTS)
    assert single.command(BIN, None)[0] == str(BIN)


def test_world_size_from_config() -> None:
    d = demo_config_dict("/tmp/ckpt")
    assert world_size(parse_config(d)) == 1
    d["build"] = {**d["build"], "tp_size": 2, "pp_size": 2}
    assert world_size(parse_config(d)) == 1, "the torch target serves on one rank whatever tp/pp say"
    d["build"]["target"] = "engine"
    assert world_size(parse_config(d)) == 4
