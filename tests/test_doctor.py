"""lpx doctor against recorded outputs: every system probe is faked, nothing touches the machine."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pipeline.cli.tools import doctor as doctor_command
from pipeline.errors import LpxError
from pipeline.facts.gpu import SMI_APPS, SMI_QUERY, GpuInfo, GpuState
from pipeline.inspection.doctor import Probe, diagnose

DATA = Path(__file__).parent / "data"
PYTRITON = Path("/venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver")
VERSIONS = {
    "nvidia-modelopt": "0.47.0",
    "transformers": "5.14.1",
    "tritonclient": "2.73.0",
    "nvidia-pytriton": "0.7.0",
}


def make_probe(
    commands: dict | None = None,
    files: dict | None = None,
    devices: list[str] | None = None,
    docker: bool = False,
    nvml: GpuState | None = None,
    free: int = 500 << 30,
) -> Probe:
    """A probe answering from recorded outputs: commands maps argv tuples to (rc, output)."""
    commands = {tuple(k): v for k, v in (commands or {}).items()}
    files = files or {}
    return Probe(
        run=lambda cmd: commands.get(tuple(cmd)),
        read=lambda path: files.get(path),
        glob=lambda pattern: list(devices or []),
        which=lambda name: "/usr/bin/docker" if docker else None,
        nvml=lambda: nvml,
        version=VERSIONS.get,
        disk_free=lambda path: free,
        tritonserver=lambda: PYTRITON,
    )


def h200_commands(query: str | None = None) -> dict:
    return {
        tuple(SMI_QUERY): (0, query or (DATA / "nvidia-smi-query-h200.csv").read_text()),
        ("nvidia-smi",): (0, (DATA / "nvidia-smi-h200.txt").read_text()),
        tuple(SMI_APPS): (0, ""),
    }


def by_name(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["checks"]}


def test_h200_box_passes():
    result = diagnose(make_probe(h200_commands(), devices=["/dev/nvidia0"]))
    checks = by_name(result)
    assert result["ok"], result
    assert "580.159.04" in checks["driver"]["detail"] and "CUDA 13.0" in checks["driver"]["detail"]
    assert checks["cuda"]["status"] == "PASS"
    assert "NVIDIA H200, sm90" in checks["gpu"]["detail"] and "fp8" in checks["gpu"]["detail"]
    assert "nvfp4" not in checks["gpu"]["detail"]
    assert "2.51" in checks["tritonserver"]["detail"]
    assert all(c["status"] == "PASS" for c in result["checks"])


def test_no_driver_fails_with_fix():
    result = diagnose(make_probe())
    driver = by_name(result)["driver"]
    assert not result["ok"]
    assert driver["status"] == "FAIL" and "install the NVIDIA driver >= 580" in driver["fix"]


def test_nouveau_loaded_fails():
    modules = "nouveau 2428928 0 - Live 0x0000000000000000\nmxm_wmi 16384 1 nouveau, Live 0x0\n"
    result = diagnose(make_probe(files={"/proc/modules": modules}))
    check = by_name(result)["nouveau"]
    assert check["status"] == "FAIL" and "blacklist" in check["fix"]


def test_container_without_gpu_devices_fails():
    result = diagnose(make_probe(h200_commands(), files={"/.dockerenv": ""}))
    check = by_name(result)["container"]
    assert check["status"] == "FAIL" and "--gpus all" in check["fix"]
    ok = diagnose(
        make_probe(h200_commands(), files={"/.dockerenv": ""}, devices=["/dev/nvidia0", "/dev/nvidiactl"])
    )
    assert by_name(ok)["container"]["status"] == "PASS"


def test_old_driver_fails_for_trtllm_12_and_names_the_line_it_can_run():
    old = "NVIDIA H100 80GB HBM3, 565.57.01, 81559, 0, 9.0\n"
    result = diagnose(make_probe(h200_commands(old)), target="1.2")
    check = by_name(result)["cuda"]
    assert check["status"] == "FAIL" and ">= 580" in check["fix"] and "0.16" in check["fix"]
    assert by_name(diagnose(make_probe(h200_commands(old)), target="0.16"))["cuda"]["status"] == "PASS"
    older = "NVIDIA A100-SXM4-80GB, 535.183.01, 81920, 0, 8.0\n"
    assert by_name(diagnose(make_probe(h200_commands(older)), target="0.16"))["cuda"]["status"] == "FAIL"


def test_busy_gpu_and_docker_without_nvidia_runtime_warn():
    state = GpuState(
        driver="580.159.04",
        cuda="13.0",
        source="nvml",
        gpus=[GpuInfo("NVIDIA H200", 143771, 90000, "9.0")],
        processes=["pid 4242 (90000 MiB on GPU 0)"],
    )
    commands = {("docker", "info", "--format", "{{json .Runtimes}}"): (0, '{"runc":{"path":"runc"}}')}
    checks = by_name(diagnose(make_probe(commands, nvml=state, docker=True)))
    assert checks["gpu-memory"]["status"] == "WARN" and "pid 4242" in checks["gpu-memory"]["detail"]
    assert checks["docker"]["status"] == "WARN" and "nvidia-ctk" in checks["docker"]["fix"]


def test_missing_tritonserver_and_low_disk():
    def missing() -> Path:
        raise LpxError("tritonserver not found (looked in PATH): install nvidia-pytriton")

    probe = make_probe(h200_commands(), free=1 << 30)
    probe.tritonserver = missing
    checks = by_name(diagnose(probe))
    assert checks["tritonserver"]["status"] == "WARN" and "install" in checks["tritonserver"]["fix"]
    assert checks["disk"]["status"] == "FAIL" and "LPX_HOME" in checks["disk"]["fix"]


def test_cli_exits_1_without_traceback(monkeypatch):
    import pipeline.inspection.doctor as doctor

    monkeypatch.setattr(doctor, "Probe", lambda: make_probe())
    result = CliRunner().invoke(doctor_command, ["--json"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["ok"] is False and by_name(data)["driver"]["status"] == "FAIL"
    result = CliRunner().invoke(doctor_command, [])
    assert isinstance(result.exception, LpxError) and "driver" in result.exception.message
    assert "fix: install the NVIDIA driver" in result.output
