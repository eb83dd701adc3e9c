"""The CPU side of a bench over servers sharing one machine: what each process of a server's tree is, the CPU
seconds each role spent, binding LPX's own hops to chosen CPUs off vLLM's, and the CPU-per-token table
(scripts/bench_vllm.py, `--pin`).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from ..errors import UsageError


def parse_cpus(text: str) -> set[int]:
    """`--pin`'s CPUs ("1", "1-3", "0,2") -> the set; UsageError naming the fix for a malformed list or a
    CPU this process may not run on."""
    try:
        cpus = {c for part in text.split(",") for c in _cpu_range(part)}
    except ValueError:
        raise UsageError(f"--pin {text}: give CPU numbers, e.g. 1 or 1-3 or 0,2") from None
    if not cpus <= os.sched_getaffinity(0):
        raise UsageError(f"--pin {text}: this machine's CPUs are {sorted(os.sched_getaffinity(0))}")
    return cpus


def _cpu_range(part: str) -> range:
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def role(proc) -> str:
    """What a process of a server's tree is, for the CPU table."""
    try:
        name, cmd = proc.name(), " ".join(proc.cmdline())
    except Exception:  # it ended meanwhile
        return "ended"
    if "tritonserver" in name:
        return "tritonserver"
    if "triton_python_backend_stub" in cmd:
        return "python stubs"
    if "vllm_worker.py" in cmd or "EngineCore" in name or "EngineCore" in cmd:
        return "vLLM engine"
    if "api_server" in cmd:
        return "vLLM API server"
    if "gateway" in cmd:
        return "gateway"
    return "other (lpx serve; vLLM's engine-core children)"


def cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of a server's process tree, by role."""
    import psutil

    out: dict[str, float] = {}
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for proc in tree:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        key = role(proc)
        out[key] = out.get(key, 0.0) + t.user + t.system
    return out


def pin_hops(pid: int, cpus: set[int]) -> list[str]:
    """Bind every thread of LPX's own hops in a server's tree (lpx serve, the gateway, tritonserver, its
    python stubs) to `cpus`, leaving vLLM's processes (the worker and all it started) where vLLM put
    them; threads started later inherit the binding. What was pinned, as "role pid", then where vLLM's
    processes' threads are."""
    import psutil

    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    vllm: set[int] = set()
    for proc in tree:
        if "vllm_worker.py" in " ".join(proc.cmdline()):
            vllm |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
    pinned, left = [], []
    for proc in tree:
        tasks = [int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir()]
        on = set()
        for task in tasks:
            try:
                if proc.pid in vllm:
                    on.add(tuple(sorted(os.sched_getaffinity(task))))
                else:
                    os.sched_setaffinity(task, cpus)
            except (ProcessLookupError, PermissionError):
                continue  # the thread ended meanwhile
        if proc.pid in vllm:
            left.append(f"vLLM {proc.pid} threads on {sorted(on)}")
            continue
        pinned.append(f"{role(proc)} {proc.pid}")
    return pinned + left


def cpu_table(cpu: dict[str, list[dict]]) -> str:
    """Per server, the CPU its tree spent per output token while it was measured (median over rounds), by
    role, and what the idle servers spent meanwhile."""
    lines = [
        "| server | CPU ms per output token, by process | idle servers' CPU s during its runs |",
        "|---|---|---|",
    ]
    for name, runs in cpu.items():
        roles = sorted({k for r in runs for k in r["own"]})
        own = ", ".join(
            f"{k} {statistics.median(r['own'].get(k, 0.0) for r in runs) * 1000 / runs[0]['tokens']:.2f}"
            for k in roles
        )
        total = statistics.median(sum(r["own"].values()) for r in runs) * 1000 / runs[0]["tokens"]
        idle = statistics.median(r["idle"] for r in runs)
        lines.append(f"| {name} | **{total:.2f}**: {own} | {idle:.1f} |")
    return "\n".join(lines)
