"""TritonServer and the streaming client against a real tritonserver running a toy decoupled model."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from pipeline import client
from pipeline.errors import LpxError
from pipeline.servers import binary
from pipeline.servers import tritonserver as serve
from pipeline.servers.child import free_ports

TOY_CONFIG = """
name: "ensemble"
backend: "python"
max_batch_size: 8
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# Streams the prompt back one word per response, at most max_tokens words, FINAL on the last one.
TOY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            limit = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            words = text.decode().split()[:limit]
            if not words:
                sender.send(flags=FINAL)
            for i, word in enumerate(words):
                out = pb_utils.Tensor("text_output", np.array([[(" " if i else "") + word]], dtype=object))
                sender.send(pb_utils.InferenceResponse([out]), flags=FINAL if i == len(words) - 1 else 0)
        return None
"""

LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, ::ffff:127.0.0.1 (gRPC)
PROMPT = "the quick brown fox jumps over the lazy dog"


def write_repo(root: Path, config: str = TOY_CONFIG) -> Path:
    model = root / "ensemble"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    (model / "1" / "model.py").write_text(TOY_MODEL)
    return root


def listening(port: int) -> set[str]:
    """IPv4/IPv6 addresses (hex, as in /proc/net) with a LISTEN socket on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(addr)
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One toy server for the streaming tests, with its own LPX_HOME."""
    tmp = tmp_path_factory.mktemp("toy")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(tmp / "lpx_home"))
        with serve.TritonServer(write_repo(tmp / "repo"), ready_timeout_s=60) as s:
            yield s


# -- without a server ------------------------------------------------------------------------------
def test_find_tritonserver_missing_names_fix(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(binary, "CONTAINER_BIN", Path("/nonexistent/tritonserver"))
    monkeypatch.setattr(binary, "bundled_root", lambda: None)
    with pytest.raises(LpxError, match=r"pip install 'lpx\[triton\]'"):
        binary.find_tritonserver()


def test_find_tritonserver_bundled():
    path = binary.find_tritonserver()
    assert path.is_file() and os.access(path, os.X_OK)


def test_busy_port_fails_before_launch(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = serve.TritonServer(write_repo(tmp_path / "repo"), grpc_port=port)
        with pytest.raises(LpxError, match=rf"{port}.*serving\.grpc_port"):
            srv.start()
        assert srv.proc is None


def test_connection_refused_names_serve(tmp_path):
    port = free_ports("127.0.0.1", 1)[0]
    for protocol in ("grpc", "http"):
        with pytest.raises(LpxError, match="lpx serve"):
            client.generate(f"127.0.0.1:{port}", "hi", 4, protocol=protocol, timeout_s=10)


# -- with a server ---------------------------------------------------------------------------------
@pytest.mark.triton
def test_lifecycle_loopback_and_cleanup(tmp_path):
    srv = serve.TritonServer(write_repo(tmp_path / "repo"), ready_timeout_s=60)
    with srv:
        assert srv.alive()
        pid, prefix = srv.proc.pid, srv.shm_prefix
        ports = srv.ports
        assert len(set(ports.values())) == 3 and all(ports.values())
        assert srv.http_url == f"127.0.0.1:{ports['http']}"
        for port in ports.values():
            addrs = listening(port)
            assert addrs and addrs <= LOOPBACK, f"port {port} must listen on 127.0.0.1 only, not {addrs}"
        assert client.generate(srv.grpc_url, "a b", 8).text == "a b"
        assert list(Path("/dev/shm").glob(f"{prefix}*")), "python backend regions use our prefix"
    assert srv.proc is None
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    assert not list(Path("/dev/shm").glob(f"{prefix}*"))
    srv.stop()  # idempotent


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_stream_words_in_order(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    chunks = list(client.generate_stream(url, PROMPT, 100, protocol=protocol, temperature=0.5))
    assert [c.text.strip() for c in chunks] == PROMPT.split()
    assert all(a.t <= b.t for a, b in zip(chunks, chunks[1:], strict=False))
    res = client.generate(url, PROMPT, 3, protocol=protocol)
    assert res.text == "the quick brown" and res.chunks == 3
    assert 0 < res.ttft_s <= res.total_s and res.tokens_per_s > 0


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unknown_model_is_pipeline_error(server, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with pytest.raises(LpxError, match="nope") as info:
        client.generate(url, PROMPT, 4, model="nope", protocol=protocol, timeout_s=10)
    assert "model name" in info.value.message


@pytest.mark.triton
def test_broken_config_shows_parse_error(tmp_path):
    repo = write_repo(
        tmp_path / "repo", TOY_CONFIG.replace("max_batch_size: 8", "max_batch_size: 8 bogus_field: 1")
    )
    srv = serve.TritonServer(repo, ready_timeout_s=60)
    with pytest.raises(LpxError, match="exited") as info:
        srv.start()
    assert "Error parsing text-format inference.ModelConfig" in (info.value.detail or "")
    assert srv.proc is None and not list(Path("/dev/shm").glob(f"{srv.shm_prefix}*"))


@pytest.mark.triton
def test_serve_forever_returns_on_signal_and_raises_on_death(tmp_path, default_sigint):
    with serve.TritonServer(write_repo(tmp_path / "repo"), ready_timeout_s=60) as srv:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        serve.serve_forever(srv, poll_s=0.1)  # returns instead of raising KeyboardInterrupt
        assert srv.alive()
        prefix = srv.shm_prefix
        srv.proc.kill()  # Triton dies; its stubs and /dev/shm regions are left behind
        with pytest.raises(LpxError, match="stopped unexpectedly"):
            serve.serve_forever(srv, poll_s=0.1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not list(Path("/dev/shm").glob(f"{prefix}*"))


@pytest.mark.triton
def test_server_dies_with_a_killed_parent(tmp_path):
    """A SIGKILLed 'lpx serve' (or test) must not leave tritonserver holding its ports and /dev/shm."""
    import signal as _signal
    import subprocess as _sp
    import sys as _sys
    import time as _time

    code = (
        "import sys, time; from pathlib import Path\n"
        "from pipeline.bench.toy import write_toy_repo\n"
        "from pipeline.servers.tritonserver import TritonServer\n"
        "s = TritonServer(write_toy_repo(Path(sys.argv[1]), 10, 5)).start()\n"
        "print(s.proc.pid, flush=True); time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "LPX_HOME": str(tmp_path / "home")}
    parent = _sp.Popen(
        [_sys.executable, "-c", code, str(tmp_path / "repo")], stdout=_sp.PIPE, text=True, env=env
    )
    pid = int(parent.stdout.readline())
    parent.send_signal(_signal.SIGKILL)
    parent.wait()
    deadline = _time.time() + 30
    while _time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if (
            Path(f"/proc/{pid}/stat").is_file()
            and Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
        ):
            break
        _time.sleep(0.2)
    else:
        os.kill(pid, _signal.SIGKILL)
        pytest.fail("tritonserver outlived the process that started it")


def test_echo_copies_a_childs_log_to_stdout_and_caps_the_file(tmp_path, capfd, monkeypatch) -> None:
    """`lpx serve --log-stdout` (the pods' Triton): every line on stdout (kubectl logs), the log file kept
    for the error tail up to its cap, then a line saying where the rest went."""
    from pipeline.servers import child

    monkeypatch.setattr(child, "ECHO_FILE_CAP", 64)
    log = tmp_path / "triton.log"
    lines = [f"line {i:03d} of the log" for i in range(40)]
    proc = child.spawn(["sh", "-c", "; ".join(f"echo '{ln}'" for ln in lines)], log, echo=True)
    assert proc.wait(timeout=30) == 0
    out, deadline = "", time.monotonic() + 10
    while lines[-1] not in out and time.monotonic() < deadline:
        out += capfd.readouterr().out  # the copying thread may still be writing
        time.sleep(0.05)
    assert all(ln in out for ln in lines), out
    kept = log.read_text()
    assert kept.startswith(lines[0]) and "the rest of the log is on stdout" in kept
    assert lines[-1] not in kept and len(kept.encode()) < 64 + 200
