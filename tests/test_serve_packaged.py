"""`lpx serve --repo DIR` serves what scripts/ci/package.sh produced, without a config, and answers
through the OpenAI gateway; the Kubernetes sidecar's command (`lpx gateway`) fronts such a Triton.

Real parts throughout: the demo's stages (quantize fp8 -> torch build -> repository), the packaging script,
the tarball unpacked read-only, tritonserver, the gateway and the official openai SDK."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from pipeline.demo import demo_config_dict

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "LPX_HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}", "NO_PROXY": "*"}


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory, tiny_checkpoint) -> Path:
    from pipeline.servers.tritonserver import find_tritonserver

    try:
        find_tritonserver()
    except Exception as exc:  # no tritonserver here: the module cannot run
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("packaged")
    cfg = root / "lpx.yaml"
    cfg.write_text(yaml.safe_dump(demo_config_dict(str(tiny_checkpoint))))
    env = env_for(root / "ci-home")
    subprocess.run(
        [str(BIN / "lpx"), "repo", "-c", str(cfg)], env=env, check=True, capture_output=True, timeout=600
    )
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ci" / "package.sh")],
        env={**env, "CONFIG": str(cfg), "IN": str(root / "in"), "OUT": str(root / "out")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    tarball = root / "out" / "lpx-repos.tgz"
    digest = (root / "out" / "lpx-repos.tgz.sha256").read_text().split()[0]
    import hashlib

    assert hashlib.sha256(tarball.read_bytes()).hexdigest() == digest
    dest = root / "models"
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    for path in [dest, *dest.rglob("*")]:  # mounted read-only in a pod
        path.chmod(path.stat().st_mode & ~0o222)
    yield dest
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)


def wait_for(record: Path, proc: subprocess.Popen, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"lpx serve exited {proc.returncode}: {proc.stdout.read()[-2000:]}")
        if record.is_file():
            try:
                return json.loads(record.read_text())
            except ValueError:
                pass
        time.sleep(0.5)
    raise AssertionError("lpx serve --repo did not become ready")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def test_serve_repo_answers_through_its_gateway_and_a_sidecar_one(unpacked: Path, tmp_path: Path) -> None:
    """`lpx serve --repo` (Triton + its gateway) answers a completion; `lpx gateway` beside the same Triton,
    as the Kubernetes pod runs it, answers a chat completion. One Triton start for both."""
    import openai

    from pipeline.servers.child import free_ports

    home = tmp_path / "home"
    proc = subprocess.Popen(
        [str(BIN / "lpx"), "serve", "--repo", str(unpacked), "--ports", "0,0,0,0"],
        env=env_for(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sidecar = None
    try:
        info = wait_for(home / "run" / "server.json", proc)
        assert info["model"] == "tiny-llama" and info["openai_url"]
        client = openai.OpenAI(base_url=f"{info['openai_url']}/v1", api_key="unused", max_retries=0)
        (model,) = [m.id for m in client.models.list().data]
        out = client.completions.create(model=model, prompt="Bread is made", max_tokens=8, temperature=0)
        assert out.choices[0].text and out.usage.completion_tokens >= 1
        assert out.choices[0].finish_reason in ("stop", "length")
        (port,) = free_ports("127.0.0.1", 1)
        sidecar = subprocess.Popen(
            [
                str(BIN / "lpx"),
                "gateway",
                "--triton",
                info["grpc_url"],
                "--repo",
                str(unpacked),
                "--port",
                str(port),
            ],
            env=env_for(tmp_path / "sidecar-home"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        side = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 180
        while True:
            try:
                chat = side.chat.completions.create(
                    model="tiny-llama",
                    messages=[{"role": "user", "content": "Hi"}],
                    max_tokens=6,
                    temperature=0,
                )
                break
            except openai.APIConnectionError:
                assert sidecar.poll() is None and time.monotonic() < deadline, sidecar.stdout.read()[-2000:]
                time.sleep(0.5)
        assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1
    finally:
        if sidecar is not None:
            assert stop(sidecar) == 0
        assert stop(proc) == 0
    assert not (home / "run" / "server.json").exists()
