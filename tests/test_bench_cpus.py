"""pipeline/bench/cpus.py on real processes: `--pin`'s CPU list, each process of a server's tree by role,
its CPU seconds by role, binding LPX's hops (every thread) while vLLM's worker and its children stay where
they are, and the CPU-per-token table of scripts/bench_vllm.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from pipeline.bench.cpus import cpu_s, cpu_table, parse_cpus, pin_hops, role
from pipeline.errors import UsageError

# A server's tree in miniature: the parent (a stand-in for `lpx serve`) starts a "gateway", a process named
# after Triton's python stub, and a vLLM worker that starts a child of its own (vLLM's engine core)
TREE = """
import subprocess, sys, time
sleep = "import time; time.sleep(120)"
vllm = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
kids = [
    subprocess.Popen([sys.executable, "-c", sleep, "pipeline.gateway"]),
    subprocess.Popen([sys.executable, "-c", sleep, "triton_python_backend_stub"]),
    subprocess.Popen([sys.executable, "-c", vllm, "vllm_worker.py"]),
]
print("up", flush=True)
time.sleep(120)
"""


@pytest.fixture
def tree(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(TREE)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        root = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60
        while len(root.children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)  # the worker's own child
        assert len(root.children(recursive=True)) == 4
        yield root
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait(30)


def test_parse_cpus():
    mine = sorted(os.sched_getaffinity(0))
    assert parse_cpus(str(mine[0])) == {mine[0]}
    assert parse_cpus(",".join(map(str, mine))) == set(mine)
    assert parse_cpus(f"{mine[0]}-{mine[0]}") == {mine[0]}
    with pytest.raises(UsageError, match=r"--pin 1-x: give CPU numbers, e\.g\. 1 or 1-3 or 0,2"):
        parse_cpus("1-x")
    with pytest.raises(UsageError, match=r"--pin 4096: this machine's CPUs are \["):
        parse_cpus("4096")


def test_roles_and_cpu_seconds_of_a_tree(tree):
    roles = sorted(role(p) for p in [tree, *tree.children(recursive=True)])
    assert roles == [
        "gateway",
        "other (lpx serve; vLLM's engine-core children)",
        "other (lpx serve; vLLM's engine-core children)",
        "python stubs",
        "vLLM engine",
    ]
    spent = cpu_s(tree.pid)
    assert set(spent) == set(roles) and all(v >= 0 for v in spent.values())
    assert spent["other (lpx serve; vLLM's engine-core children)"] > 0  # two interpreters started
    assert cpu_s(2**22 + 12345) == {}  # a server that is gone


def test_pin_binds_lpx_hops_and_leaves_vllm_alone(tree):
    mine = sorted(os.sched_getaffinity(0))
    target = {mine[-1]}
    vllm = [p for p in tree.children(recursive=True) if "vllm_worker.py" in " ".join(p.cmdline())][0]
    vllm_tree = [vllm, *vllm.children(recursive=True)]
    said = pin_hops(tree.pid, target)
    pinned = [line for line in said if not line.startswith("vLLM ")]
    assert sorted(line.split()[0] for line in pinned) == ["gateway", "other", "python"]
    assert [line for line in said if line.startswith("vLLM ")] == [
        f"vLLM {p.pid} threads on [{tuple(mine)}]" for p in vllm_tree
    ]
    for proc in [tree, *tree.children(recursive=True)]:
        want = set(mine) if proc in vllm_tree else target
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            assert os.sched_getaffinity(int(task)) == want, (role(proc), task)


def test_cpu_table():
    runs = [
        {"own": {"gateway": 0.5, "vLLM engine": 2.0}, "tokens": 1000.0, "idle": 0.25},
        {"own": {"gateway": 0.7, "vLLM engine": 2.2}, "tokens": 1000.0, "idle": 0.35},
        {"own": {"vLLM engine": 2.4}, "tokens": 1000.0, "idle": 0.15},
    ]
    lines = cpu_table({"lpx-vllm": runs}).splitlines()
    assert lines[0].startswith("| server | CPU ms per output token")
    assert lines[2] == "| lpx-vllm | **2.50**: gateway 0.50, vLLM engine 2.20 | 0.2 |"
