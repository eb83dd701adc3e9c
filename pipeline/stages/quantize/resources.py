"""What the quantize stage checks and records about the machine: disk space before and while writing the
exports (estimated from `lpx plan`'s weight sizes), and host / GPU memory after each phase."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from ...errors import LpxError, disk_full, disk_full_cause
from ...inspection.checkpoint import CheckpointInfo

DISK_MARGIN = 1.05  # headroom over plan's weight bytes: file headers, scales plan does not count


def estimate_bytes(
    info: CheckpointInfo, fmt: str, exports: tuple[str, ...], scratch_state: bool = False
) -> dict:
    """Bytes each export will take, from `lpx plan`'s weight sizes (the state file holds bf16 weights)."""
    from ...inspection.plan import shape_from_config, weight_bytes

    shape = shape_from_config(info.config, info.path.name)
    quantized = weight_bytes(shape, fmt)["weight_bytes"]
    full = weight_bytes(shape, "none")["weight_bytes"]
    # TensorRT-LLM's checkpoint carries a tied lm_head as its own tensor (share_embedding_table false)
    tied_head = 2 * shape.vocab * shape.hidden if shape.tied_embeddings else 0
    sizes = {"trtllm": quantized + tied_head, "hf": quantized, "state": full}
    out = {e: int(sizes[e] * DISK_MARGIN) + (64 << 20) for e in exports}
    if scratch_state:
        out["state (temporary, for a clean copy)"] = int(full * DISK_MARGIN)
    return out


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (its nearest existing parent); one place to patch in tests."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(
    info: CheckpointInfo,
    fmt: str,
    exports: tuple[str, ...],
    out: Path,
    model: str,
    variant: str,
    scratch_state: bool = False,
) -> dict:
    """Refuse before any work when the disk that holds `out` cannot take the exports."""
    need = estimate_bytes(info, fmt, exports, scratch_state)
    total, free = sum(need.values()), free_bytes(out)
    if total > free:
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in need.items())
        raise LpxError(
            f"Not enough disk for variant '{variant}' of {model}: its exports need about {total / 2**30:.2f} GiB "
            f"({parts}) but {out.parent} has {free / 2**30:.2f} GiB free - free space there, point LPX_HOME at a "
            "larger disk, or drop entries from quantization.exports"
        )
    return {"estimated_bytes": need, "free_bytes_before": free}


@contextlib.contextmanager
def disk_full_is_an_error(out: Path):
    """A disk that fills while writing becomes a DiskFull naming the folder and the free space (the runner's
    staging folder is then removed, so nothing that looks complete is left)."""
    try:
        yield
    except Exception as exc:
        cause = disk_full_cause(exc)
        if cause is None:
            raise
        raise disk_full(out, cause, "writing the quantize exports") from None


def gpu_memory(phase: str, into: dict) -> None:
    """On CUDA, record after `phase` the GPU memory allocated now and the peak so far (GiB, by PyTorch's
    allocator; the peak is cumulative since the caller last reset it, so the phase where it jumps is the one
    that set it)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        into[phase] = {
            "allocated": round(torch.cuda.memory_allocated() / 2**30, 3),
            "peak": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        }


def host_memory(phase: str, into: dict) -> None:
    """Record after `phase` this process's peak resident memory so far (GiB; Linux reports KiB)."""
    import resource

    into[phase] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
