"""A small table of the GPUs LPX plans for, and lookup by the loose names people and drivers use.

Figures are the vendors' datasheet numbers (memory as marketed, HBM/GDDR bandwidth in TB/s) and
the memory `nvidia-smi` reports (MiB), which is what capacity planning must use. `source` names the
datasheet; `smi_mib_source` says whether the nvidia-smi figure was recorded here or is a lead.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..errors import PipelineError


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
    """Like find_gpu, but an unknown name is a PipelineError listing the known ones."""
    gpu = find_gpu(name)
    if gpu is None:
        known = ", ".join(GPUS)
        raise PipelineError(f"unknown GPU '{name}' - use one of: {known}", exit_code=2)
    return gpu


def formats_for_sm(sm: int) -> list[str]:
    """The quantization formats (pipeline.stages.quantize.recipes.FORMATS) an SM number can run."""
    from ..stages.quantize.recipes import FORMATS

    return [fmt for fmt, (_, need) in FORMATS.items() if sm >= need]
