"""The real model (SmolLM2-135M-Instruct, from the GGUF that `make real-model` installs) for the tests that
need it: `lpx` as a user runs it (a child process), and the one `lpx init --example smollm2` of a test
session (conftest.py's `smollm2_init`), whose conversion test_examples checks and test_real_model and
test_vllm_serving serve."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m-instruct"  # the example's model name: its checkpoint folder in the project


def lpx(*args: str, home: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m pipeline ARGS` in a child process with its own LPX_HOME: exit code and output as a user sees them."""
    full = {**os.environ, "LPX_HOME": str(home), "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=full,
        timeout=timeout,
    )


def init_example(root: Path) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """`lpx init ROOT/proj --example smollm2` into a folder that holds what a conversion killed part-way
    leaves (a temporary folder with a config.json): the process, the project folder, the leftover's path."""
    folder = root / "proj"
    leftover = folder / f".{NAME}.tmp-999999"
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("{}")
    return lpx("init", str(folder), "--example", "smollm2", home=root / "home", timeout=900), folder, leftover
