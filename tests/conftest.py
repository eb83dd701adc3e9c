"""Shared fixtures, all of them here (test modules import no fixtures from one another). Every test
gets its own LPX_HOME, so no test sees another's state."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    home = tmp_path / "lpx_home"
    monkeypatch.setenv("LPX_HOME", str(home))
    return home


@pytest.fixture
def default_sigint():
    """SIGINT as Python installs it in an interactive process (KeyboardInterrupt), restored afterwards.
    A suite started with SIGINT ignored (`nohup make test`, some CI runners) inherits SIG_IGN: Python then
    keeps it, `_thread.interrupt_main()` does nothing and a handler restored on exit is SIG_IGN. A test
    that depends on Ctrl-C's behaviour takes this fixture instead of the runner's disposition."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """The demo's tiny Llama checkpoint, written once per test session (seeded)."""
    from pipeline.demo import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="session")
def smollm2_gguf():
    """The real model's GGUF, found in LPX's environment. Fails, naming `make real-model`, where it is not
    installed (it is part of `make test`): these tests never skip."""
    from pipeline.errors import LpxError
    from pipeline.examples import example_gguf

    try:
        return example_gguf("smollm2")[1]
    except LpxError as exc:
        pytest.fail(f"{exc.message} (these tests need the real model: run 'make real-model')")


@pytest.fixture(scope="session")
def smollm2_init(smollm2_gguf, tmp_path_factory):
    """`lpx init DIR --example smollm2` once per session (one real GGUF conversion, ~35 s on 2 cores):
    (the finished process, the project folder, the leftover it had to sweep)."""
    from helpers_real_model import init_example

    return init_example(tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="session")
def smollm2_checkpoint(smollm2_init):
    """The converted SmolLM2-135M-Instruct checkpoint of `smollm2_init` (read only: copy it to change it)."""
    from helpers_real_model import NAME

    res, folder, _ = smollm2_init
    assert res.returncode == 0, res.stdout + res.stderr
    return folder / NAME


@pytest.fixture
def demo_config(tmp_path, tiny_checkpoint):
    """A demo lpx.yaml in tmp_path pointing at the shared tiny checkpoint; returns its path."""
    import yaml

    from pipeline.demo import demo_config_dict

    data = demo_config_dict(str(tiny_checkpoint))
    path = tmp_path / "lpx.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def torch_engine_dir(tmp_path_factory):
    """A torch engine dir (FP8 fake-quant tiny Llama), built once per session (helpers_engine.py)."""
    from helpers_engine import session_engine_dir

    return session_engine_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def torch_engine(torch_engine_dir):
    """A running TorchEngine on the session's engine dir, one per test module."""
    from pipeline.runtime.engines.torch_engine import TorchEngine

    eng = TorchEngine(torch_engine_dir)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def torch_triton(torch_engine_dir, tmp_path_factory):
    """A tritonserver on the demo's repository for the torch engine, started once per session and shared by
    the modules that only send it requests (test_triton_e2e, test_monitoring_live): one start (about 30 s
    on a CPU) instead of one per module. Skipped without tritonserver."""
    from helpers_engine import running_server

    from pipeline.config import parse_config
    from pipeline.demo import demo_config_dict
    from pipeline.stages.repository import write_repository

    root = tmp_path_factory.mktemp("triton")
    cfg = parse_config(demo_config_dict(str(root / "unused-checkpoint")))
    write_repository(root / "repo", torch_engine_dir, cfg)
    yield from running_server(root / "repo", root)
