"""tritonserver is restarted once when it aborts while loading with boost::interprocess's lock_exception
(Triton server #8882, tensorrtllm_backend #521), and only then.

The decision (`known_load_abort`) is checked on the log lines of the reported aborts and on other real
failure lines. The restart itself runs on a real tritonserver whose python model really makes Triton abort
with that exception while loading: its `initialize` overwrites the header of the python backend's
shared-memory region (the stub's command line names the region; the header holds the backend's
interprocess mutex, `shm_mutex`), so the next lock of that mutex, in the stub and in tritonserver,
throws boost::interprocess::lock_exception and the C++ runtime aborts, as under load.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import StageFailed
from pipeline.servers import tritonserver as serve

CONFIG = """
name: "m"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

# FAULT is "lock" (break the backend's shared-memory mutex) or "raise" (an ordinary load error); ONCE: only on the first load (a marker file beside the model remembers it).
MODEL = """
import mmap
import os
from pathlib import Path

FAULT, ONCE = {fault!r}, {once!r}


class TritonPythonModel:
    def initialize(self, args):
        marker = Path(__file__).with_name("faulted")
        if ONCE and marker.exists():
            return
        marker.touch()
        if FAULT == "raise":
            raise RuntimeError("model failed to initialize")
        region = open("/proc/self/cmdline", "rb").read().split(b"\\0")[2].decode()
        fd = os.open("/dev/shm/" + region, os.O_RDWR)
        try:
            with mmap.mmap(fd, 0) as shm:
                shm[:256] = b"\\xff" * 256
        finally:
            os.close(fd)

    def execute(self, requests):
        return []
"""

# Lines of the reported aborts, as their logs show them.
REPORTED = [
    # tensorrtllm_backend #521, tritonserver under mpirun
    "terminate called after throwing an instance of 'boost::interprocess::lock_exception'",
    "  what():  boost::interprocess::lock_exception",
    # tensorrtllm_backend #562, the python stub's side
    "[cnwla-a800-p01142:3219109] *** End of error message ***\n"
    "I0809 10:17:47.426345 3220531 pb_stub.cc:2025]  Non-graceful termination detected. \n"
    "terminate called after throwing an instance of 'boost::interprocess::lock_exception'",
]
# Failure lines of other causes (from real tritonserver logs): never restarted.
OTHERS = [
    'E1204 15:38:24.083522 14350 server.cc:241] "CudaDriverHelper has not been initialized."',
    "Unable to initialize shared memory key 'triton_python_backend_shm_region_2' to requested size "
    "(67108864 bytes). If you are running Triton inside docker, use '--shm-size' flag to control the "
    "shared memory region size. Error: No space left on device",
    "E1204 15:39:49.639053 15401 model_lifecycle.cc:642] \"failed to load 'm' version 1: Internal: "
    'RuntimeError: model failed to initialize\\n\\nAt:\\n  /tmp/repo/m/1/model.py(3): initialize\\n"',
    "error: creating server: Internal - failed to load all models",
    "[h100-2:00149] Signal: Aborted (6)",
    "failed to start GRPC service: Unavailable - Socket '127.0.0.1:8001' already in use",
]


@pytest.mark.parametrize("text", REPORTED)
def test_known_load_abort_finds_the_reported_lock_failure(text: str) -> None:
    assert "boost::interprocess::lock_exception" in serve.known_load_abort(text)


@pytest.mark.parametrize("text", OTHERS)
def test_known_load_abort_ignores_other_failures(text: str) -> None:
    assert serve.known_load_abort(text) is None


def write_repo(root: Path, fault: str, once: bool) -> Path:
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "config.pbtxt").write_text(CONFIG)
    (root / "m" / "1" / "model.py").write_text(MODEL.format(fault=fault, once=once))
    return root


def server(tmp_path: Path, fault: str, once: bool) -> tuple[serve.TritonServer, list[str]]:
    notices: list[str] = []
    srv = serve.TritonServer(
        write_repo(tmp_path / "repo", fault, once),
        log_path=tmp_path / "triton.log",
        ready_timeout_s=120,
        notify=notices.append,
    )
    return srv, notices


@pytest.mark.triton
def test_a_lock_abort_while_loading_is_restarted_once(tmp_path: Path) -> None:
    srv, notices = server(tmp_path, "lock", once=True)
    with srv:
        assert srv.alive()
        kept = tmp_path / "triton.first-attempt.log"
        assert len(notices) == 1 and "restarting it once" in notices[0] and str(kept) in notices[0], notices
        assert "boost::interprocess::lock_exception" in notices[0]
        assert serve.known_load_abort(kept.read_text(errors="replace")), "the first log is kept as it was"
        assert serve.known_load_abort((tmp_path / "triton.log").read_text(errors="replace")) is None


@pytest.mark.triton
def test_a_second_lock_abort_is_reported_not_retried(tmp_path: Path) -> None:
    srv, notices = server(tmp_path, "lock", once=False)
    with pytest.raises(StageFailed, match=r"aborted again while loading .* after one restart") as exc:
        srv.start()
    assert len(notices) == 1, notices
    assert srv.proc is None and not list(Path("/dev/shm").glob(f"{srv.shm_prefix}*"))
    assert "lock_exception" in exc.value.detail


@pytest.mark.triton
def test_another_load_failure_is_not_restarted(tmp_path: Path) -> None:
    srv, notices = server(tmp_path, "raise", once=False)
    with pytest.raises(StageFailed, match=r"exited with code .* while loading") as exc:
        srv.start()
    assert notices == [] and not (tmp_path / "triton.first-attempt.log").exists()
    assert "model failed to initialize" in exc.value.detail


def test_lpx_serve_says_so_on_its_terminal() -> None:
    """`lpx run` / `lpx serve` build their TritonServer with the run's Reporter: the notice is a warning
    line on the terminal (stderr), printed as is (a log line's brackets are not rich markup)."""
    from rich.console import Console

    from pipeline.config import parse_config
    from pipeline.demo import demo_config_dict
    from pipeline.progress import Reporter
    from pipeline.served import server

    console = Console(record=True, width=400)
    srv = server(parse_config(demo_config_dict("unused")), "fp8", None, Reporter(console))
    srv.notify("restarting it once ('[h100-2:00149] boost::interprocess::lock_exception')")
    assert console.export_text().strip() == (
        "warning: restarting it once ('[h100-2:00149] boost::interprocess::lock_exception')"
    )
