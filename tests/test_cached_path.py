"""A cached `lpx run` imports nothing heavy (issue 34): with every stage cached, `lpx run --until repo`
and `lpx run` up to the moment it starts serving import neither torch, transformers nor ModelOpt (nor
numpy, grpc or the tokenizers: none of them is needed to compute a key and find it cached), so a no-op run
takes well under a second. The next import chain that pulls one in (a constant imported from the torch
engine, a library silenced by importing it) fails here, naming the module and the chain that loaded it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

NEVER_CACHED = ("torch", "transformers", "modelopt")  # the three: never on a cached path
NEVER_UNTIL_REPO = (*NEVER_CACHED, "numpy", "grpc", "tokenizers", "safetensors", "tritonclient.grpc")

# Runs the CLI in a fresh interpreter and reports, for each watched module, the stack that imported it
# first; with `serve` in argv, the smoke step (Triton + one streamed completion) is replaced by a marker
# so the check covers everything `lpx run` does before it serves, without starting a server.
PROBE = r"""
import builtins, json, sys, traceback
watch = set(json.loads(sys.argv[1]))
first = {}
real_import = builtins.__import__

def spy(name, globals=None, locals=None, fromlist=(), level=0):
    module = real_import(name, globals, locals, fromlist, level)
    for m in watch - first.keys():
        if m in sys.modules:
            first[m] = "".join(traceback.format_stack(limit=14)[:-1])
    return module

builtins.__import__ = spy
import pipeline.served as served
def no_smoke(cfg, variant, repo, report, out):
    print("SERVE-REACHED", variant, file=sys.stderr)
served.serve_and_check = no_smoke
from pipeline.cli import main
sys.argv = ["lpx", *sys.argv[2:]]
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"code": code, "first": first}))
"""


def _lpx(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LPX_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env, timeout=600
    )


def _probe(home: Path, watch: tuple[str, ...], *args: str) -> tuple[dict, str]:
    env = {**os.environ, "LPX_HOME": str(home), "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(watch), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert res.stdout.strip(), res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


@pytest.mark.slow
def test_a_cached_run_imports_no_torch(demo_config, isolated_home):
    data = yaml.safe_load(demo_config.read_text())
    data["variants"].append({"name": "bf16", "quantization": {"format": "none"}})
    demo_config.write_text(yaml.safe_dump(data, sort_keys=False))

    built = _lpx(isolated_home, "run", "-c", str(demo_config), "--until", "repo")
    assert built.returncode == 0, built.stderr
    assert built.stderr.count("running") == 8, built.stderr  # 4 stages x 2 variants ran

    result, err = _probe(isolated_home, NEVER_UNTIL_REPO, "run", "-c", str(demo_config), "--until", "repo")
    assert result["code"] == 0, err
    assert err.count("cached") == 8 and "running" not in err, err
    assert result["first"] == {}, "a cached run imported " + "\n".join(
        f"{m}, first through:\n{stack}" for m, stack in result["first"].items()
    )

    result, err = _probe(isolated_home, NEVER_CACHED, "run", "-c", str(demo_config))
    assert result["code"] == 0, err
    assert "SERVE-REACHED fp8" in err and "SERVE-REACHED bf16" in err, err  # the probe got as far as serving
    assert err.count("cached") == 8 and "running" not in err, err
    assert result["first"] == {}, "a cached run imported " + "\n".join(
        f"{m}, first through:\n{stack}" for m, stack in result["first"].items()
    )


def test_the_probe_sees_what_a_command_imports(demo_config, isolated_home):
    """The check above can fail: the same probe reports a module a command does import, with the stack
    through LPX's code that imported it (`lpx config validate` reads the YAML and checks it with pydantic)."""
    result, err = _probe(isolated_home, ("yaml", "pydantic"), "config", "validate", "-c", str(demo_config))
    assert result["code"] == 0, err
    assert set(result["first"]) == {"yaml", "pydantic"}, err
    assert all("pipeline/" in stack for stack in result["first"].values()), result["first"]
