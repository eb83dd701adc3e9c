"""Staging folders of killed runs are removed by the next run of that stage (cached or not), never a live
run's; `lpx artifacts gc` lists what no config references (dry run) and removes it with --yes.
Real processes, real files."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from pipeline.artifacts import OWNER, Store, is_orphan, process_start
from pipeline.cli import cli
from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.progress import Reporter
from pipeline.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
# A stage that gets as far as writing into its staging folder, then waits to be killed.
STAGER = """
import sys, time
from pipeline.artifacts import Store
store = Store()
slot = store.slot("build", "tiny-llama", "v", "sm90")  # the demo model: the slot runner() steps in
with store.lock(slot), store.staging(slot, sys.argv[1]) as tmp:
    (tmp / "engine.bin").write_bytes(b"half an engine")
    print(tmp, flush=True)
    time.sleep(600)
"""


def start_stager(key: str, home: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGER, key],
        env={**os.environ, "LPX_HOME": str(home), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, Path(proc.stdout.readline().strip())


def runner() -> tuple[Runner, io.StringIO]:
    out = io.StringIO()
    return Runner(parse_config(demo_config_dict("checkpoint")), Reporter(Console(file=out, width=300))), out


def step(r: Runner) -> None:
    r.step("build", "v", "sm90", {"a": 1}, lambda tmp: (tmp / "engine.bin").write_bytes(b"x") and {})


def test_a_sigkilled_stage_is_swept_by_the_next_run_even_a_cached_one(isolated_home):
    r, _ = runner()
    step(r)  # a complete artifact: the next run of this stage is a cache hit
    killed, tmp = start_stager("deadbeef0001", isolated_home)
    assert (tmp / "engine.bin").is_file() and (tmp / OWNER).read_text().split()[0] == str(killed.pid)
    killed.send_signal(signal.SIGKILL)
    time.sleep(0.2)  # not reaped yet: a zombie holds the pid
    assert is_orphan(tmp), "a killed process that is not reaped yet is gone all the same"
    r, log = runner()
    step(r)
    assert "cached" in log.getvalue()
    assert not tmp.exists(), "the killed run's staging folder was left behind"
    killed.wait()


def test_a_live_runs_staging_folder_is_kept(isolated_home):
    live, tmp = start_stager("deadbeef0002", isolated_home)
    try:
        assert not is_orphan(tmp)
        # what the sweep sees: the live run holds the lock, so sweep directly as the next run would
        assert Store().sweep(tmp.parent) == [] and tmp.is_dir()
    finally:
        live.kill()
        live.wait()
    assert Store().sweep(tmp.parent) == [tmp] and not tmp.exists()


def test_a_reused_pid_does_not_keep_a_dead_runs_folder(isolated_home):
    slot = Store().slot("build", "m", "v", "sm90")
    alive = os.getppid()  # a running process, but not the one that made the folder
    folder = slot / f".tmp-abc-{alive}"
    folder.mkdir(parents=True)
    (folder / OWNER).write_text(f"{alive} 1\n")  # started at tick 1: long before this process
    assert process_start(alive) not in (None, "1")
    untold = slot / f".tmp-abd-{alive}"  # no start time recorded (an older LPX): the live pid keeps it
    untold.mkdir()
    assert Store().sweep(slot) == [folder] and untold.is_dir()


@pytest.mark.slow
def test_gc_lists_then_removes_what_no_config_references(tmp_path, isolated_home, tiny_checkpoint):
    data = demo_config_dict(str(tiny_checkpoint))
    data["calibration"] = {"samples": 4, "seq_len": 32, "batch_size": 2}
    data["variants"].append({"name": "int8", "quantization": {"format": "int8_sq"}})
    cfg_path = tmp_path / "lpx.yaml"

    def run(data) -> list:
        cfg_path.write_text(json.dumps(data))
        cfg = parse_config(data)
        return Runner(cfg, Reporter(Console(file=io.StringIO()))).run(cfg.variants, "repo")

    old = {o.variant: o for o in run(data)}
    data["build"]["max_batch_size"] = 4  # new build and repo keys; quantize and eval unchanged
    data["variants"] = data["variants"][:1]  # int8 is gone from the config
    new = run(data)[0]
    killed, orphan = start_stager("deadbeef0003", isolated_home)
    killed.kill()
    killed.wait()

    dry = CliRunner().invoke(cli, ["artifacts", "gc", "-c", str(cfg_path)])
    assert dry.exit_code == 0, dry.output
    stale = [old["fp8"].artifacts["build:any"].path, old["fp8"].artifacts["repo:any"].path]
    gone_variant = [a.path for a in old["int8"].artifacts.values()]
    for path in stale + gone_variant + [orphan]:
        assert str(path) in dry.output and path.exists(), dry.output
    assert "no config gives this slot this key any more" in dry.output
    assert "no config has this variant / arch any more" in dry.output
    assert "staging folder of a killed run" in dry.output and " MiB  " in dry.output
    assert "dry run: nothing removed" in dry.output
    for art in new.artifacts.values():
        assert str(art.path) not in dry.output

    done = CliRunner().invoke(cli, ["artifacts", "gc", "-c", str(cfg_path), "--yes"])
    assert done.exit_code == 0, done.output
    assert not any(p.exists() for p in stale + gone_variant + [orphan])
    assert all(a.path.is_dir() for a in new.artifacts.values())
    again = CliRunner().invoke(cli, ["artifacts", "gc", "-c", str(cfg_path)])
    assert again.output.startswith("0 folder(s)"), again.output
    # the artifacts still in use are untouched and still cached
    out = io.StringIO()
    cfg = parse_config(data)
    Runner(cfg, Reporter(Console(file=out, width=300))).run(cfg.variants, "repo")
    assert "running" not in out.getvalue()


def test_gc_needs_a_config_and_says_so(isolated_home, tmp_path):
    res = CliRunner().invoke(cli, ["artifacts", "gc"])
    assert res.exit_code == 2 and "--config" in res.output
