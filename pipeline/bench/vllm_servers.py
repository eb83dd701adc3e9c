"""The servers scripts/bench_vllm.py compares, started side by side on one machine: LPX's vllm and torch
targets (`lpx repo` + `lpx serve` of a demo-shaped config per target) and vLLM's own OpenAI server on the
vllm build's folder (the build's engine arguments, the worker's environment: tcmalloc / Intel OpenMP).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import StageFailed, UsageError

ROOT = Path(__file__).resolve().parents[2]
LPX = ROOT / ".venv" / "bin" / "lpx"
SERVERS = ("lpx-vllm", "lpx-torch", "vllm-own")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(work: Path, checkpoint: Path, target: str, port: int) -> Path:
    from pipeline.demo import demo_config_dict

    data = demo_config_dict(str(checkpoint))
    data["model"]["name"] = checkpoint.name.lower().replace("_", "-")
    data["variants"] = [{"name": "bf16", "quantization": {"format": "none"}}]
    data["build"]["target"] = target
    data["serving"].update(ready_timeout_s=900, openai={"port": port})
    path = work / f"{target}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise StageFailed(f"{url}: the server exited ({proc.returncode}) - its log says why")
        try:
            opener.open(f"{url}/v1/models", timeout=5).read()
            return
        except OSError:
            time.sleep(2)
    raise StageFailed(f"{url}: not ready after {timeout_s:.0f} s - its log says why")


def start_lpx(cfg: Path, port: int, log: Path, env: dict) -> tuple[str, subprocess.Popen]:
    subprocess.run([str(LPX), "repo", "-c", str(cfg)], check=True, env=env)
    proc = subprocess.Popen(
        [str(LPX), "serve", "-c", str(cfg)], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env
    )
    return f"http://127.0.0.1:{port}", proc


def start_vllm_own(env: dict, log: Path) -> tuple[str, subprocess.Popen]:
    from pipeline.artifacts import Store  # noqa: F401 - the LPX_HOME in env is the one searched below
    from pipeline.runtime.engines import vllm_engine
    from pipeline.stages.build.vllm_target import serve_command

    builds = sorted(Path(env["LPX_HOME"]).glob(f"artifacts/engines/*/bf16/*/*/{vllm_engine.MODEL_FILE}"))
    folder = builds[-1].parent
    python = vllm_engine.find_python()
    port = free_port()
    argv = [python, *serve_command(folder, port=port), "--served-model-name", "vllm-own"]
    proc = subprocess.Popen(
        argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=vllm_engine.worker_env(python)
    )
    return f"http://127.0.0.1:{port}", proc


def served_model(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return json.loads(opener.open(f"{url}/v1/models", timeout=30).read())["data"][0]["id"]


@dataclass
class Fleet:
    """The servers up: name -> URL, their processes (in `servers`' order), and the trace folder of each
    LPX server started with LPX_TRACE."""

    servers: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    traces: dict[str, Path] = field(default_factory=dict)

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in zip(self.servers, self.procs, strict=True)}

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def chosen_servers(text: str) -> set[str]:
    """`--servers`' list -> the set; UsageError for a name not in SERVERS."""
    chosen = set(text.split(","))
    if not chosen <= set(SERVERS):
        raise UsageError(f"--servers: {text} - choose among {', '.join(SERVERS)}")
    return chosen


def start_servers(
    fleet: Fleet, chosen: set[str], work: Path, env: dict, checkpoint: Path, trace: bool
) -> None:
    """Start the `chosen` servers into `fleet`, each waited for until it answers (vLLM's own needs the
    vllm target's build only, which `lpx build` makes when lpx-vllm is not among them)."""
    for target in ("vllm", "torch"):
        if f"lpx-{target}" not in chosen and not (target == "vllm" and "vllm-own" in chosen):
            continue
        port = free_port()
        served_env = dict(env)
        cfg = config(work, checkpoint, target, port)
        if f"lpx-{target}" not in chosen:  # vLLM's own server needs the vllm build only
            subprocess.run([str(LPX), "build", "-c", str(cfg)], check=True, env=env)
            continue
        if trace:  # only for a server that runs: --trace with vllm-own alone traced a server never started
            fleet.traces[f"lpx-{target}"] = work / "trace" / target
            shutil.rmtree(fleet.traces[f"lpx-{target}"], ignore_errors=True)
            served_env["LPX_TRACE"] = str(fleet.traces[f"lpx-{target}"])
        url, proc = start_lpx(cfg, port, work / f"{target}.log", served_env)
        fleet.procs.append(proc)
        wait_ready(url, proc)
        fleet.servers[f"lpx-{target}"] = url
    if "vllm-own" in chosen:
        url, proc = start_vllm_own(env, work / "vllm-own.log")
        fleet.procs.append(proc)
        wait_ready(url, proc)
        fleet.servers["vllm-own"] = url
