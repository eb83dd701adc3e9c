"""`lpx doctor`: is this machine ready to quantize, build and serve? Each check is PASS, WARN or FAIL
with a one-line fix; any FAIL exits 1.

Every look at the system goes through a `Probe` (run a command, read a file, glob, NVML, package
versions, disk space), so tests feed recorded outputs instead of touching the machine.

JSON fields (`lpx doctor --json`): ok (bool: no FAIL), target (TensorRT-LLM line checked against),
checks[]: name, status (PASS|WARN|FAIL), detail, fix (empty when nothing to do).
"""

from __future__ import annotations

import glob as _glob
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import toolchain
from ..artifacts import home
from ..errors import LpxError
from ..facts.formats import formats_for_sm
from ..facts.gpu import GpuState, find_gpu, gpu_state, nvml_state, run_command
from ..facts.trtllm import BUILD_LINES, LINES, PYTRITON_SERVER

PACKAGES = ("nvidia-modelopt", "transformers", "tritonclient", "tensorrt_llm")
MIN_FREE_DISK = {"FAIL": 5 * 1024**3, "WARN": 50 * 1024**3}


# ---------------------------------------------------------------- probes


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _disk_free(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _tritonserver() -> Path:
    from ..servers.binary import find_tritonserver

    return find_tritonserver()


@dataclass
class Probe:
    run: Callable[[list[str]], tuple[int, str] | None] = run_command
    read: Callable[[str], str | None] = _read
    glob: Callable[[str], list[str]] = _glob.glob
    which: Callable[[str], str | None] = shutil.which
    nvml: Callable[[], GpuState | None] = nvml_state
    version: Callable[[str], str | None] = toolchain.version
    disk_free: Callable[[Path], int] = _disk_free
    tritonserver: Callable[[], Path] = _tritonserver


# ---------------------------------------------------------------- checks

Check = dict[str, str]


def _check(name: str, status: str, detail: str, fix: str = "") -> Check:
    return {"name": name, "status": status, "detail": detail, "fix": fix}


def gpu_checks(probe: Probe, target: str) -> list[Check]:
    state = gpu_state(probe.run, probe.nvml)
    rel = LINES[target]
    if state is None:
        return [
            _check(
                "driver",
                "FAIL",
                "no NVIDIA driver: NVML unavailable and nvidia-smi missing or failing",
                f"install the NVIDIA driver >= {rel.min_driver} (e.g. 'apt install nvidia-driver-{rel.min_driver}-server') "
                "and reboot, or run LPX on a GPU machine; the torch target needs no GPU",
            )
        ]
    checks = [
        _check("driver", "PASS", f"driver {state.driver}, CUDA {state.cuda or '?'} (via {state.source})"),
        _cuda_check(state, target),
    ]
    for i, g in enumerate(state.gpus):
        checks += _one_gpu_checks(state, i, g)
    return checks


def _cuda_check(state: GpuState, target: str) -> Check:
    """The driver against the TensorRT-LLM line `target`: too old (FAIL, naming the lines it can run), an
    older CUDA than the container's (WARN), or fine."""
    rel = LINES[target]
    major = int(state.driver.split(".")[0]) if state.driver and state.driver[0].isdigit() else 0
    ok_lines = [t for t, r in LINES.items() if major >= r.min_driver]
    if major < rel.min_driver:
        alt = f"; this driver can run TensorRT-LLM {', '.join(ok_lines)}" if ok_lines else ""
        return _check(
            "cuda",
            "FAIL",
            f"TensorRT-LLM {target} ({rel.container}, CUDA {rel.cuda}) needs "
            f"driver >= {rel.min_driver}, found {state.driver} [{rel.evidence}]",
            f"upgrade the driver to >= {rel.min_driver}{alt} (set build.trtllm_version)",
        )
    if state.cuda and _ver(state.cuda) < _ver(rel.cuda)[:2]:
        return _check(
            "cuda",
            "WARN",
            f"driver {state.driver} reports CUDA {state.cuda}, the "
            f"TensorRT-LLM {target} container uses CUDA {rel.cuda}",
            "upgrade the driver if the container reports a CUDA driver mismatch",
        )
    return _check(
        "cuda",
        "PASS",
        f"TensorRT-LLM {target} needs driver >= {rel.min_driver}, CUDA "
        f"{rel.cuda}; driver supports CUDA {state.cuda or '?'} [{rel.evidence.split(':')[0]}]",
    )


def _one_gpu_checks(state: GpuState, i: int, g) -> list[Check]:
    """GPU `i`'s compute capability (and the formats it runs), and its memory already in use."""
    sm = g.sm
    known = find_gpu(g.name)
    detail = (
        f"GPU {i}: {g.name}, sm{sm}, {g.total_mib} MiB; formats: {', '.join(formats_for_sm(sm)) or 'none'}"
    )
    if sm and sm < 80:
        gpu = _check(
            "gpu", "WARN", detail, "TensorRT-LLM 1.x needs sm80 (Ampere) or newer: use the torch target"
        )
    else:
        gpu = _check("gpu", "PASS", detail + ("" if known else " (not in lpx's GPU table: plan with --gpu)"))
    used = g.used_mib / g.total_mib if g.total_mib else 0
    if used > 0.1:
        memory = _check(
            "gpu-memory",
            "WARN",
            f"GPU {i}: {g.used_mib} of {g.total_mib} MiB in use by "
            f"{'; '.join(state.processes) or 'other processes'}",
            "stop the processes holding GPU memory, or lower kv_cache_free_gpu_mem_fraction",
        )
    else:
        memory = _check("gpu-memory", "PASS", f"GPU {i}: {g.total_mib - g.used_mib} MiB free")
    return [gpu, memory]


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def system_checks(probe: Probe) -> list[Check]:
    checks = []
    modules = probe.read("/proc/modules") or ""
    if any(line.split(" ", 1)[0] == "nouveau" for line in modules.splitlines()):
        checks.append(
            _check(
                "nouveau",
                "FAIL",
                "the open-source nouveau driver is loaded and blocks the NVIDIA driver",
                "blacklist it ('blacklist nouveau' in /etc/modprobe.d/blacklist-nouveau.conf), "
                "run 'update-initramfs -u' and reboot",
            )
        )
    in_container = probe.read("/.dockerenv") is not None or probe.read("/run/.containerenv") is not None
    if in_container and not probe.glob("/dev/nvidia*"):
        checks.append(
            _check(
                "container",
                "FAIL",
                "inside a container with no /dev/nvidia* devices",
                "start it with GPU access: 'docker run --gpus all ...' (NVIDIA Container Toolkit) "
                "or 'podman run --device nvidia.com/gpu=all ...'",
            )
        )
    elif in_container:
        checks.append(_check("container", "PASS", "inside a container with GPU devices"))
    if probe.which("docker"):
        out = probe.run(["docker", "info", "--format", "{{json .Runtimes}}"])
        if out is None or out[0] != 0:
            checks.append(
                _check(
                    "docker",
                    "WARN",
                    "docker is installed but 'docker info' failed",
                    "start the docker daemon or add your user to the docker group",
                )
            )
        elif "nvidia" in out[1]:
            checks.append(_check("docker", "PASS", "docker has the nvidia runtime"))
        else:
            checks.append(
                _check(
                    "docker",
                    "WARN",
                    "docker has no nvidia runtime",
                    "install nvidia-container-toolkit and run 'nvidia-ctk runtime configure --runtime=docker'",
                )
            )
    return checks


def software_checks(probe: Probe) -> list[Check]:
    checks = []
    try:
        binary = probe.tritonserver()
    except LpxError as exc:
        checks.append(
            _check("tritonserver", "WARN", "tritonserver not found", exc.message.split(": ", 1)[-1])
        )
    else:
        version = (probe.read(str(binary.parent.parent / "TRITON_VERSION")) or "").strip()
        if not version and "pytriton" in str(binary):
            pkg = probe.version("nvidia-pytriton")
            version = (
                PYTRITON_SERVER.get(pkg or "", "") and f"{PYTRITON_SERVER[pkg or '']} (nvidia-pytriton {pkg})"
            )
        checks.append(_check("tritonserver", "PASS", f"{binary} version {version or 'unknown'}"))
    versions = {p: probe.version(p) for p in PACKAGES}
    detail = ", ".join(f"{p} {v or '-'}" for p, v in versions.items())
    missing = [p for p in PACKAGES[:3] if not versions[p]]
    if missing:
        checks.append(
            _check(
                "packages",
                "WARN",
                detail,
                f"pip install {' '.join(missing)} (or install lpx with its extras)",
            )
        )
    else:
        note = (
            ""
            if versions["tensorrt_llm"]
            else " (no tensorrt_llm: engine/llmapi targets need the TRT-LLM container)"
        )
        checks.append(_check("packages", "PASS", detail + note))
    root = home()
    free = probe.disk_free(root)
    status = "FAIL" if free < MIN_FREE_DISK["FAIL"] else "WARN" if free < MIN_FREE_DISK["WARN"] else "PASS"
    checks.append(
        _check(
            "disk",
            status,
            f"{free / 1024**3:.1f} GiB free under {root} (LPX_HOME)",
            ""
            if status == "PASS"
            else "free space there or point LPX_HOME at a larger disk "
            "(an 8B model needs ~16 GB per bf16 copy plus engines)",
        )
    )
    return checks


def diagnose(probe: Probe | None = None, target: str = BUILD_LINES[0]) -> dict:
    """All checks, as the documented JSON structure."""
    probe = probe or Probe()
    checks = gpu_checks(probe, target) + system_checks(probe) + software_checks(probe)
    return {"ok": not any(c["status"] == "FAIL" for c in checks), "target": target, "checks": checks}
