"""The one GPU module: a table of the GPUs LPX plans for, lookup by the loose names people and drivers
use, and detection of the GPUs present (NVML, else nvidia-smi). Nothing else in LPX asks the driver.

Table figures are the vendors' datasheet numbers (memory as marketed, HBM/GDDR bandwidth in TB/s) and
the memory `nvidia-smi` reports (MiB), which is what capacity planning must use. `source` names the
datasheet; `smi_mib_source` says whether the nvidia-smi figure was recorded here or is a lead.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from ..errors import UsageError

log = logging.getLogger("lpx.gpu")


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    memory_gb: float  # as marketed (vendor GB)
    smi_mib: int  # memory.total as nvidia-smi reports it
    bandwidth_tbs: float  # peak memory bandwidth, TB/s (1e12 bytes/s)
    sm: int  # compute capability as an SM number: 80, 86, 89, 90, 100
    fp8: bool
    nvfp4: bool
    source: str
    smi_mib_source: str = "lead: nvidia-smi memory.total as commonly reported, not recorded here"

    @property
    def memory_bytes(self) -> int:
        return self.smi_mib * 1024 * 1024

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_tbs * 1e12

    def as_dict(self) -> dict[str, object]:
        return {
            **asdict(self),
            "memory_bytes": self.memory_bytes,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
        }


GPUS: dict[str, Gpu] = {
    g.key: g
    for g in (
        Gpu(
            "a100-40gb",
            "A100 40GB SXM",
            40,
            40960,
            1.555,
            80,
            False,
            False,
            "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM: HBM2, 1,555 GB/s)",
        ),
        Gpu(
            "a100-80gb",
            "A100 80GB SXM",
            80,
            81920,
            2.039,
            80,
            False,
            False,
            "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: HBM2e, 2,039 GB/s)",
        ),
        Gpu(
            "a10g",
            "A10G",
            24,
            23028,
            0.600,
            86,
            False,
            False,
            "NVIDIA A10 Tensor Core GPU datasheet (24 GB GDDR6, 600 GB/s); A10G is the AWS G5 variant",
        ),
        Gpu(
            "l4",
            "L4",
            24,
            23034,
            0.300,
            89,
            True,
            False,
            "NVIDIA L4 Tensor Core GPU datasheet (24 GB GDDR6, 300 GB/s)",
        ),
        Gpu(
            "l40s",
            "L40S",
            48,
            46068,
            0.864,
            89,
            True,
            False,
            "NVIDIA L40S GPU datasheet (48 GB GDDR6 ECC, 864 GB/s)",
        ),
        Gpu(
            "h100-sxm",
            "H100 SXM",
            80,
            81559,
            3.35,
            90,
            True,
            False,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 80 GB HBM3, 3.35 TB/s)",
        ),
        Gpu(
            "h100-pcie",
            "H100 PCIe",
            80,
            81559,
            2.0,
            90,
            True,
            False,
            "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe: 80 GB HBM2e, 2 TB/s)",
        ),
        Gpu(
            "h200",
            "H200 SXM",
            141,
            143771,
            4.8,
            90,
            True,
            False,
            "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 141 GB HBM3e, 4.8 TB/s)",
            "recorded: nvidia-smi on the project's H200 box (143771 MiB)",
        ),
        Gpu(
            "b200",
            "B200",
            180,
            183359,
            7.7,
            100,
            True,
            True,
            "NVIDIA DGX B200 / HGX B200 datasheets (180 GB HBM3e and 7.7 TB/s per GPU; "
            "the Blackwell chip is marketed as 192 GB / 8 TB/s)",
        ),
    )
}

# Most specific first; matched against the lower-cased name with 'nvidia', 'tesla' and every
# non-alphanumeric character removed ("NVIDIA H100 80GB HBM3" -> "h10080gbhbm3").
_PATTERNS: list[tuple[str, str]] = [
    ("a100-40gb", r"a100.*40g"),
    ("a100-80gb", r"a100"),
    ("a10g", r"a10g"),
    ("l40s", r"l40s"),
    ("l4", r"^l4(?!\d)"),
    ("h100-pcie", r"h100.*pcie"),
    ("h100-sxm", r"^h100(?!.*nvl)"),
    ("h200", r"^h200"),
    ("b200", r"^b200"),
]


def normalize(name: str) -> str:
    s = name.lower().replace("nvidia", "").replace("tesla", "")
    return re.sub(r"[^a-z0-9]", "", s)


def find_gpu(name: str) -> Gpu | None:
    """The table entry for a loose name ("h200", "NVIDIA H200", "H100 80GB HBM3"), or None."""
    s = normalize(name)
    exact = {key.replace("-", ""): gpu for key, gpu in GPUS.items()}
    if s in exact:
        return exact[s]
    for key, pattern in _PATTERNS:
        if re.search(pattern, s):
            return GPUS[key]
    return None


def lookup_gpu(name: str) -> Gpu:
    """Like find_gpu, but an unknown name is a UsageError listing the known ones."""
    gpu = find_gpu(name)
    if gpu is None:
        known = ", ".join(GPUS)
        raise UsageError(f"unknown GPU '{name}' - use one of: {known}")
    return gpu


# ---------------------------------------------------------------- the GPUs present


@dataclass
class GpuInfo:
    """One GPU the driver reports."""

    name: str
    total_mib: int
    used_mib: int
    compute_cap: str  # "9.0"

    @property
    def sm(self) -> int:
        """Compute capability as an SM number (0 when the driver gave none)."""
        digits = self.compute_cap.replace(".", "")
        return int(digits) if digits.isdigit() else 0

    @property
    def arch(self) -> str:
        """The build.archs name: "sm90"."""
        return f"sm{self.sm}"


@dataclass
class GpuState:
    driver: str | None = None
    cuda: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    source: str = ""


def run_command(cmd: list[str]) -> tuple[int, str] | None:
    """(exit code, stdout + stderr), or None when the program is not installed."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (FileNotFoundError, PermissionError):
        return None
    except subprocess.TimeoutExpired:
        return 124, f"{cmd[0]} timed out"
    return p.returncode, p.stdout + p.stderr


def nvml_state() -> GpuState | None:
    """The GPU state through NVML (nvidia-ml-py), or None when NVML is absent or fails."""
    try:
        import pynvml as nv
    except ImportError:  # nvidia-ml-py is optional: nvidia-smi answers instead
        log.debug("nvidia-ml-py is not installed: asking nvidia-smi")
        return None
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:  # no driver (a CPU machine), or one NVML cannot open
        log.debug("NVML did not start (%s): asking nvidia-smi", exc)
        return None
    try:
        cuda = nv.nvmlSystemGetCudaDriverVersion()
        state = GpuState(
            driver=_s(nv.nvmlSystemGetDriverVersion()),
            cuda=f"{cuda // 1000}.{cuda % 1000 // 10}",
            source="nvml",
        )
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            state.gpus.append(
                GpuInfo(_s(nv.nvmlDeviceGetName(h)), mem.total >> 20, mem.used >> 20, f"{major}.{minor}")
            )
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                state.processes.append(f"pid {p.pid} ({(p.usedGpuMemory or 0) >> 20} MiB on GPU {i})")
        return state
    except nv.NVMLError as exc:  # a query the driver refused part-way: nvidia-smi may still answer
        log.warning("NVML query failed (%s): GPU state from nvidia-smi instead", exc)
        return None
    finally:
        nv.nvmlShutdown()


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=name,driver_version,memory.total,memory.used,compute_cap",
    "--format=csv,noheader,nounits",
]
SMI_APPS = [
    "nvidia-smi",
    "--query-compute-apps=pid,process_name,used_memory",
    "--format=csv,noheader,nounits",
]


def gpu_state(
    run: Callable[[list[str]], tuple[int, str] | None] = run_command,
    nvml: Callable[[], GpuState | None] = nvml_state,
    full: bool = True,
) -> GpuState | None:
    """NVML first, then nvidia-smi; None when neither finds a driver. `full`: also the CUDA version the
    driver supports and the processes holding GPU memory (two more nvidia-smi calls without NVML).
    `run` and `nvml` are what `lpx doctor`'s tests replace with recorded outputs."""
    state = nvml()
    if state is not None:
        return state
    out = run(SMI_QUERY)
    if out is None or out[0] != 0:
        return None
    state = GpuState(source="nvidia-smi")
    for line in out[1].strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 5:
            name, state.driver, total, used, cap = cells
            state.gpus.append(GpuInfo(name, _mib(total), _mib(used), cap))
    if full:
        header = run(["nvidia-smi"])
        if header and (m := re.search(r"CUDA Version:\s*([\d.]+)", header[1])):
            state.cuda = m.group(1)
        apps = run(SMI_APPS)
        if apps and apps[0] == 0:
            state.processes = [
                f"pid {c[0]} {c[1]} ({c[2]} MiB)"
                for line in apps[1].strip().splitlines()
                if len(c := [x.strip() for x in line.split(",")]) == 3
            ]
    return state if state.driver else None


def _mib(text: str) -> int:
    m = re.search(r"\d+", text)
    return int(m.group()) if m else 0


def detect_gpu() -> GpuInfo | None:
    """The first GPU present, or None without a driver."""
    state = gpu_state(full=False)
    return state.gpus[0] if state and state.gpus else None
