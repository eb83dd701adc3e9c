"""trtllm-build command composition and the child-process runner, against the flags contract and
tests/standin_trtllm_build.py (TensorRT-LLM cannot be installed here)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from helpers_trtllm import DEMO_LIMITS, STANDIN, run_standin, write_checkpoint

from pipeline.artifacts import owner_alive  # a zombie counts as dead
from pipeline.config import parse_config
from pipeline.errors import LpxError
from pipeline.facts.formats import FORMATS
from pipeline.stages.build import trtllm_build as tb
from pipeline.stages.build import trtllm_run as tr

HERE = Path(__file__).resolve().parent
CONTRACT = json.loads((HERE / "contracts" / "trtllm_build_flags.json").read_text())
LPX_VERSION = {"latest": "1.2", "v0.16.0": "0.16"}
CASES = [
    (v, f)
    for v in ("latest", "v0.16.0")
    for f in ("none", "fp8", "int4_awq", "w4a8_awq", "int8_sq", "nvfp4")
    if not (f == "nvfp4" and v == "v0.16.0")
]


def make_config(fmt: str = "none", **build):
    return parse_config(
        {
            "model": {"name": "tiny", "checkpoint": "/nonexistent"},
            "variants": [{"name": fmt, "quantization": {"format": fmt}}],
            "build": {"target": "engine", **DEMO_LIMITS, **build},
        }
    )


def flags_of(argv: list[str]) -> dict[str, str]:
    assert argv[0] == "trtllm-build" and len(argv) % 2 == 1, argv
    return dict(zip(argv[1::2], argv[2::2], strict=True))


@pytest.fixture
def standin_binary(monkeypatch):
    monkeypatch.setenv(tr.BINARY_ENV, f"{sys.executable} {STANDIN}")


@pytest.mark.parametrize("version,fmt", CASES)
def test_compose_accepted_by_standin_and_contract(tmp_path, version, fmt):
    ckpt = write_checkpoint(tmp_path / "ckpt", fmt)
    argv, reasons = tb.compose(
        make_config(fmt), fmt, ckpt, tmp_path / "engine", tmp_path / "timing.cache", LPX_VERSION[version]
    )
    flags = {f["flag"]: f for f in CONTRACT["versions"][version]["flags"]}
    for flag, value in flags_of(argv).items():
        spec = flags[flag]  # KeyError = a flag this version does not have
        assert spec.get("action") != "store_true", flag
        assert not spec.get("deprecated") or (version == "v0.16.0" and flag == "--paged_kv_cache"), flag
        if isinstance(spec.get("choices"), list):
            assert value in spec["choices"], (flag, value)
        if spec["type"] == "int":
            assert int(value) >= 1, (flag, value)
        if str(spec["default"]) != value:
            assert reasons.get(flag), f"no dry-run reason for non-default {flag} {value}"
    res = run_standin(argv, version, tmp_path)
    assert res.returncode == 0, res.stderr
    engine = json.loads((tmp_path / "engine" / "config.json").read_text())
    assert list(engine) == CONTRACT["engine_output"]["config_json_top_level_keys"]
    assert set(engine["build_config"]) == set(CONTRACT["engine_output"]["build_config_keys"][version])
    plugins = engine["build_config"]["plugin_config"]
    assert set(plugins) == set(CONTRACT["engine_output"]["plugin_config_keys"][version])
    assert engine["build_config"]["kv_cache_type"] == "PAGED"
    assert engine["build_config"]["max_seq_len"] == 1024 and engine["build_config"]["max_batch_size"] == 8
    assert plugins["use_paged_context_fmha"] is True and plugins["paged_kv_cache"] is True
    assert plugins["use_fp8_context_fmha"] is (FORMATS[fmt].quant_algo in {"FP8", "W4A8_AWQ", "NVFP4"})
    assert plugins["tokens_per_block"] == tb.TOKENS_PER_BLOCK and plugins["multiple_profiles"] is True
    assert (tmp_path / "engine" / "rank0.engine").is_file()


@pytest.mark.parametrize("version", ["latest", "v0.16.0"])
def test_fp8_demo_argv(tmp_path, version):
    argv, _ = tb.compose(
        make_config("fp8"), "fp8", tmp_path, tmp_path / "e", tmp_path / "t.cache", LPX_VERSION[version]
    )
    f = flags_of(argv)
    assert (f["--max_batch_size"], f["--max_input_len"], f["--max_seq_len"], f["--max_num_tokens"]) == (
        "8",
        "512",
        "1024",
        "4096",
    )
    assert f["--gemm_plugin"] == "auto" and f["--use_fp8_context_fmha"] == "enable"
    assert ("--kv_cache_type" in f) == (version == "latest") and ("--paged_kv_cache" in f) == (
        version != "latest"
    )
    small, _ = tb.compose(
        make_config("fp8", max_batch_size=4),
        "fp8",
        tmp_path,
        tmp_path / "e",
        tmp_path / "t.cache",
        LPX_VERSION[version],
    )
    assert flags_of(small)["--gemm_plugin"] == "fp8"


def test_compose_reuses_existing_timing_cache(tmp_path):
    cache = tmp_path / "t.cache"
    argv, _ = tb.compose(make_config(), "none", tmp_path, tmp_path / "e", cache, "1.2")
    assert "--input_timing_cache" not in argv and flags_of(argv)["--output_timing_cache"] == str(cache)
    cache.write_bytes(b"x")
    argv, _ = tb.compose(make_config(), "none", tmp_path, tmp_path / "e", cache, "1.2")
    assert flags_of(argv)["--input_timing_cache"] == str(cache)


def test_compose_refusals(tmp_path):
    with pytest.raises(LpxError, match="trtllm_version: 1.2"):
        tb.compose(make_config("nvfp4"), "nvfp4", tmp_path, tmp_path / "e", tmp_path / "t", "0.16")
    with pytest.raises(LpxError, match="1.2 or 0.16"):
        tb.compose(make_config(), "none", tmp_path, tmp_path / "e", tmp_path / "t", "0.12")
    ckpt = write_checkpoint(tmp_path / "ckpt", world=2)
    with pytest.raises(LpxError, match="tp_size"):
        tb.compose(make_config(), "none", ckpt, tmp_path / "e", tmp_path / "t", "1.2")
    argv, _ = tb.compose(make_config(tp_size=2), "none", ckpt, tmp_path / "e", tmp_path / "t", "1.2")
    assert flags_of(argv)["--workers"] == "2"


@pytest.mark.parametrize("version", ["latest", "v0.16.0"])
@pytest.mark.parametrize(
    "fmt,kv,paged_ctx",
    [
        ("fp8", "fp8", "enable"),
        ("int4_awq", "fp8", "disable"),
        ("none", "fp8", "disable"),
        ("int8_sq", "int8", "disable"),
        ("int8_sq", "none", "enable"),
    ],
)
def test_kv_cache_quantization_and_paged_context_fmha(tmp_path, version, fmt, kv, paged_ctx):
    ckpt = write_checkpoint(tmp_path / "ckpt", fmt, kv={"none": None, "fp8": "FP8", "int8": "INT8"}[kv])
    argv, reasons = tb.compose(
        make_config(fmt), fmt, ckpt, tmp_path / "e", tmp_path / "t", LPX_VERSION[version], kv_cache=kv
    )
    assert flags_of(argv)["--use_paged_context_fmha"] == paged_ctx and reasons["--use_paged_context_fmha"]
    res = run_standin(argv, version, tmp_path)
    assert res.returncode == 0, res.stderr
    # the stand-in holds the builder's rule: paged context FMHA with this KV cache would fail
    forced = list(argv)
    forced[forced.index("--use_paged_context_fmha") + 1] = "enable"
    assert run_standin(forced, version, tmp_path).returncode == (0 if paged_ctx == "enable" else 1)


@pytest.mark.parametrize(
    "bad,version",
    [
        (["--max_output_len", "8"], "latest"),
        (["--auto_parallel", "2"], "latest"),
        (["--gemm_plugin", "nvfp4"], "v0.16.0"),
        (["--kv_cache_type", "blocks"], "latest"),
        (["--context_fmha"], "latest"),
        (["--max_batch_size", "x"], "v0.16.0"),
    ],
)
def test_standin_rejects_illegal_argv(tmp_path, bad, version):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    res = run_standin(["trtllm-build", "--checkpoint_dir", str(ckpt), *bad], version, tmp_path)
    assert res.returncode == 2 and "error:" in res.stderr


def test_standin_checks_ranks_and_rules(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", world=2)
    (ckpt / "rank1.safetensors").unlink()
    res = run_standin(
        ["trtllm-build", "--checkpoint_dir", str(ckpt), "--output_dir", str(tmp_path / "e")],
        "latest",
        tmp_path,
    )
    assert res.returncode == 1 and "rank1.safetensors" in res.stderr
    ckpt = write_checkpoint(tmp_path / "ok")
    res = run_standin(
        [
            "trtllm-build",
            "--checkpoint_dir",
            str(ckpt),
            "--multiple_profiles",
            "enable",
            "--opt_num_tokens",
            "64",
        ],
        "latest",
        tmp_path,
    )
    assert res.returncode == 1 and "opt_num_tokens" in res.stderr


def test_run_build_success(tmp_path, standin_binary, monkeypatch):
    monkeypatch.setenv("STANDIN_TRTLLM_VERSION", "latest")
    ckpt = write_checkpoint(tmp_path / "ckpt", "fp8")
    argv, _ = tb.compose(make_config("fp8"), "fp8", ckpt, tmp_path / "engine", tmp_path / "t.cache", "1.2")
    lines: list[str] = []
    elapsed = tr.run_build(argv, tmp_path / "build.log", timeout_s=60, progress=lines.append)
    assert elapsed > 0 and any("Total time" in line for line in lines)
    log = (tmp_path / "build.log").read_text()
    assert log.startswith("$ ") and "--checkpoint_dir" in log and "Total time" in log
    assert (tmp_path / "engine" / "config.json").is_file() and (
        tmp_path / "engine" / "rank0.engine"
    ).is_file()
    assert (tmp_path / "t.cache").is_file()


@pytest.mark.parametrize(
    "knob,message,in_log_tail",
    [
        ("STANDIN_FAIL", "exit code 1", "out of memory"),
        ("STANDIN_KILLED", "killed by SIGKILL", "Build phase: starting"),
    ],
)
def test_run_build_failures_carry_the_log_tail(
    tmp_path, standin_binary, monkeypatch, knob, message, in_log_tail
):
    """A non-zero exit and a child killed from outside are both failures, with the log's tail attached."""
    monkeypatch.setenv(knob, "1")
    ckpt = write_checkpoint(tmp_path / "ckpt")
    argv, _ = tb.compose(make_config(), "none", ckpt, tmp_path / "engine", tmp_path / "t", "1.2")
    with pytest.raises(LpxError, match=message) as info:
        tr.run_build(argv, tmp_path / "build.log", timeout_s=60)
    assert in_log_tail in info.value.detail and "build.log" in info.value.message
    assert not (tmp_path / "engine" / "config.json").exists()


@pytest.fixture
def sleeping_build(tmp_path, standin_binary, monkeypatch) -> tuple[list[str], Path]:
    """(argv, pid file) of a stand-in build that sleeps for a minute and records its processes' pids."""
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("STANDIN_SLEEP", "60")
    monkeypatch.setenv("STANDIN_PIDFILE", str(pidfile))
    ckpt = write_checkpoint(tmp_path / "ckpt")
    argv, _ = tb.compose(make_config(), "none", ckpt, tmp_path / "engine", tmp_path / "t", "1.2")
    return argv, pidfile


def test_run_build_timeout_kills_process_group(tmp_path, sleeping_build):
    argv, pidfile = sleeping_build
    start = time.monotonic()
    with pytest.raises(LpxError, match="timeout") as info:
        tr.run_build(argv, tmp_path / "build.log", timeout_s=2)
    assert time.monotonic() - start < 20
    assert "sleeping" in info.value.detail
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 5
    while any(owner_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(owner_alive(p) for p in pids), "a build process outlived the timeout"
    assert not (tmp_path / "engine").exists()


def test_run_build_keyboard_interrupt_kills_child(tmp_path, sleeping_build, default_sigint):
    argv, pidfile = sleeping_build

    def interrupt(line: str) -> None:  # raised in the reader thread: emulate Ctrl-C in the main thread
        if "sleeping" in line:
            import _thread

            _thread.interrupt_main()

    with pytest.raises(KeyboardInterrupt):
        tr.run_build(argv, tmp_path / "build.log", timeout_s=60, progress=interrupt)
    pids = [int(p) for p in pidfile.read_text().split()]
    deadline = time.monotonic() + 5
    while any(owner_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(owner_alive(p) for p in pids)


def test_missing_binary_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(tr.BINARY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LpxError, match="LPX_TRTLLM_BUILD") as info:
        tr.run_build(["trtllm-build"], tmp_path / "build.log", timeout_s=5)
    assert "container" in info.value.message
    monkeypatch.setenv(tr.BINARY_ENV, str(tmp_path / "nope"))
    with pytest.raises(LpxError, match="does not name a program"):
        tr.run_build(["trtllm-build"], tmp_path / "build.log", timeout_s=5)


def test_engine_versions_shape():
    """The manifest's toolchain record: the installed distributions' versions, None where absent, whether
    or not TensorRT-LLM is installed (it is inside the containers LPX targets, not here)."""
    from pipeline import toolchain

    versions = tr.engine_versions()
    assert set(versions) == {"gpu", "sm", "driver", "cuda", "tensorrt", "tensorrt_llm"}
    assert versions["tensorrt_llm"] == toolchain.version("tensorrt_llm", "tensorrt-llm")
    assert versions["tensorrt"] == toolchain.version(*tr.TENSORRT_DISTS)
    assert all(v is None or isinstance(v, str) and v for v in versions.values()), versions
