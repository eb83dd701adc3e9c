"""Running `trtllm-build` as a child process: the binary ($LPX_TRTLLM_BUILD or PATH), its output streamed
to build.log, its exit code checked, the timeout enforced, its process group killed on timeout or
interrupt; and the toolchain record (GPU, driver, CUDA, TensorRT, TensorRT-LLM) for the manifest."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import StageFailed, UsageError
from ...servers import child
from ...toolchain import version

BINARY_ENV = "LPX_TRTLLM_BUILD"
LOG_TAIL_LINES = 40
log = logging.getLogger("lpx.build")
TENSORRT_DISTS = ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt_cu13", "tensorrt_cu12")


def find_binary(binary: str | None = None) -> list[str]:
    """The command that runs trtllm-build: `binary`, else $LPX_TRTLLM_BUILD, else trtllm-build on PATH."""
    spec = binary or os.environ.get(BINARY_ENV)
    if spec:
        cmd = shlex.split(spec)
        if cmd and (shutil.which(cmd[0]) or Path(cmd[0]).is_file()):
            return cmd
        raise UsageError(
            f"{BINARY_ENV}={spec!r} does not name a program - point it at trtllm-build or unset it"
        )
    found = shutil.which("trtllm-build")
    if not found:
        raise UsageError(
            "trtllm-build is not on PATH - run inside a TensorRT-LLM container (lpx doctor names it), set "
            f"{BINARY_ENV}=/path/to/trtllm-build, or use build.target: torch"
        )
    return [found]


def _tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def run_build(
    argv: list[str],
    log_path: Path,
    timeout_s: float,
    binary: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> float:
    """Run trtllm-build (argv[0] is replaced by the resolved binary), stream its output to log_path
    and to progress(line), and return the elapsed seconds. Raises StageFailed, with the log tail
    in `detail`, on a non-zero exit or a timeout; the child's process group is killed on timeout
    and on KeyboardInterrupt."""
    cmd = find_binary(binary) + [str(a) for a in argv[1:]]
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as logfile:
        logfile.write("$ " + shlex.join(cmd) + "\n")
        logfile.flush()
        try:
            proc = child.spawn(cmd, None)
        except OSError as exc:
            raise UsageError(f"cannot start {cmd[0]}: {exc} - check {BINARY_ENV} or PATH") from None
        reader = threading.Thread(
            target=_pump, args=(proc, logfile, log_path, progress), name="trtllm-build-log", daemon=True
        )
        reader.start()
        rc = _wait(proc, reader, timeout_s, log_path)
    elapsed = time.monotonic() - start
    _check_exit(rc, log_path)
    return elapsed


def _pump(proc: subprocess.Popen, logfile, log_path: Path, progress: Callable[[str], None] | None) -> None:
    """Copy the child's output to logfile and progress(line). Keeps draining the pipe even if progress()
    fails, so the child never blocks."""
    assert proc.stdout is not None
    report = progress
    for line in proc.stdout:
        logfile.write(line)
        logfile.flush()
        if report is not None:
            try:
                report(line.rstrip("\n"))
            except Exception as exc:  # broad on purpose: a display must not stop the log or the build
                log.warning(
                    "build progress display failed (%s: %s): trtllm-build's output goes on to %s only",
                    type(exc).__name__,
                    exc,
                    log_path,
                )
                report = None


def _wait(proc: subprocess.Popen, reader: threading.Thread, timeout_s: float, log_path: Path) -> int:
    """The child's exit code; on a timeout or an interrupt its process group is killed first."""
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.stop(proc, grace_s=5.0, whole_group=True)
        reader.join(timeout=5)
        raise StageFailed(
            f"trtllm-build did not finish within the {timeout_s:g} s timeout and was killed - "
            f"raise the build timeout or lower the build limits; log: {log_path}",
            detail=_tail(log_path),
        ) from None
    except BaseException:  # KeyboardInterrupt and friends: never leave a build running
        child.stop(proc, grace_s=5.0, whole_group=True)
        reader.join(timeout=5)
        raise
    reader.join(timeout=30)
    return rc


def _check_exit(rc: int, log_path: Path) -> None:
    """A non-zero exit code as StageFailed with the log's tail: a signal (most often the OOM killer) or a failure."""
    if rc < 0:  # killed from outside, most often by the kernel's OOM killer
        raise StageFailed(
            f"trtllm-build was killed by {signal.Signals(-rc).name} (exit code {rc}) - if the machine "
            f"ran out of memory, lower build.max_batch_size/max_num_tokens or use fewer workers; log: "
            f"{log_path}",
            detail=_tail(log_path),
        )
    if rc != 0:
        raise StageFailed(
            f"trtllm-build failed (exit code {rc}) - see the log tail below or {log_path}",
            detail=_tail(log_path),
        )


def _cuda_version() -> str | None:
    try:
        import torch
    except ImportError:  # no torch here: the manifest records the CUDA version as unknown
        return None
    return torch.version.cuda


def engine_versions() -> dict:
    """GPU, SM, driver, CUDA, TensorRT and TensorRT-LLM versions for the manifest (None where absent)."""
    return {
        **_gpu(),
        "cuda": _cuda_version(),
        "tensorrt": version(*TENSORRT_DISTS),
        "tensorrt_llm": version("tensorrt_llm", "tensorrt-llm"),
    }


def _gpu() -> dict[str, str | None]:
    from ...facts.gpu import gpu_state

    state = gpu_state(full=False)
    first = state.gpus[0] if state and state.gpus else None
    return {
        "gpu": first.name if first else None,
        "sm": first.arch if first else None,
        "driver": state.driver if state else None,
    }
