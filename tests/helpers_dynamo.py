"""NVIDIA Dynamo's own components for tests/test_dynamo_runtime.py and tests/test_dynamo_vllm.py, from the
environment `make dynamo` builds (.venv-dynamo: ai-dynamo and ai-dynamo-runtime 1.6.1, constraints/dynamo.txt).

Also a script, run by those tests with the Dynamo environment's Python (stdlib only at import):
- `parse`: each {"module", "args"} case on stdin through that component's own argument parser (dynamo.frontend,
  dynamo.trtllm, dynamo.vllm, dynamo.mocker), one JSON line out per case: the parsed values or the error.
- `serve`: start the processes given on stdin (file discovery in DYN_FILE_KV, the TCP request plane: no etcd,
  no NATS), wait until the frontend lists the model, send one OpenAI chat request, print what came back and
  stop them all. The tests run it inside a network namespace of its own (`unshare --net`): Dynamo's event
  plane binds ZeroMQ on 0.0.0.0 whatever DYN_EVENT_PLANE_HOST says, and there that is the namespace's loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DYNAMO_PY = ROOT / ".venv-dynamo" / "bin" / "python"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
# Where Dynamo's runtime binds and advertises (the request plane would take the machine's address)
LOOPBACK = {
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_SYSTEM_HOST": "127.0.0.1",
    "DYN_HTTP_RPC_HOST": "127.0.0.1",
    "DYN_SELF_HOST_METADATA": "0",
    "HF_HUB_OFFLINE": "1",
}


def dynamo_env(kv: Path, home: Path) -> dict[str, str]:
    """The environment of every Dynamo process of one test: discovery in files under `kv` (what
    `--discovery-backend file` reads), caches under `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "KUBERNETES_"))}
    return {**env, **LOOPBACK, "DYN_FILE_KV": str(kv), "HOME": str(home), "PYTHONUNBUFFERED": "1"}


def run_script(python: Path, command: str, payload, env: dict, timeout: float, netns: bool = False):
    """This file as a script under `python` (stdin: the payload as JSON; stdout: JSON lines), in a
    network namespace of its own with `netns`. Its whole process group is killed on a timeout."""
    argv = [str(python), __file__, command]
    proc = subprocess.Popen(
        (["unshare", "--net"] if netns else []) + argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(json.dumps(payload), timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{command} ran past {timeout} s: {err[-3000:]}") from None
    assert proc.returncode == 0, f"{command} exited {proc.returncode}: {err[-3000:]}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


# ---- run under Dynamo's environment --------------------------------------------------------------------


def _parse(module: str, args: list[str]) -> dict:
    """One component's own parser on `args`: what it took, as plain values."""
    if module == "dynamo.frontend":
        from dynamo.frontend.main import parse_args

        sys.argv = ["dynamo.frontend", *args]
        config = parse_args()[0]
    elif module == "dynamo.trtllm":
        from dynamo.trtllm.args import parse_args

        config = parse_args(args)
    elif module == "dynamo.vllm":
        from dynamo.vllm.args import parse_args

        config = parse_args(args)
    elif module == "dynamo.mocker":
        from dynamo.mocker.args import parse_args

        config = parse_args(args)
    else:
        raise ValueError(module)
    plain = (str, int, float, bool, type(None))
    values = dict(vars(config))
    engine = values.pop("engine_args", None)
    out = {k: v if isinstance(v, plain) else str(v) for k, v in values.items()}
    if engine is not None:  # dynamo.vllm: vLLM's AsyncEngineArgs as parsed
        out["engine"] = {k: v for k, v in vars(engine).items() if isinstance(v, plain)}
    return out


def parse_main() -> None:
    for case in json.load(sys.stdin):
        try:
            out = {"ok": True, "values": _parse(case["module"], case["args"])}
        except SystemExit as exc:  # argparse's and Dynamo's own refusals
            out = {"ok": False, "error": f"exit {exc.code}"}
        except Exception as exc:
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"module": case["module"], **out}, default=str), flush=True)


DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy from the env


def _get(url: str, body: dict | None = None, timeout: float = 30) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with DIRECT.open(req, timeout=timeout) as r:
        return json.loads(r.read())


def _wait_for_model(base: str, model: str, procs: list, deadline: float) -> float:
    start, last = time.monotonic(), None
    while time.monotonic() < deadline:
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"exited before the model was served: {dead}")
        try:
            if any(m["id"] == model for m in _get(f"{base}/v1/models", timeout=5)["data"]):
                return time.monotonic() - start
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    raise RuntimeError(f"{model} not listed by {base}/v1/models in time (last: {last})")


def _loopback_up() -> None:
    """A new network namespace's `lo` is down: up it (SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))


def serve_main() -> None:
    """stdin: {"processes": [[argv], ...], "logs": dir, "port", "model", "timeout", "messages", "max_tokens"}."""
    spec = json.load(sys.stdin)
    _loopback_up()
    logs = Path(spec["logs"])
    procs = []
    try:
        for i, argv in enumerate(spec["processes"]):
            log = open(logs / f"{i}-{Path(argv[2] if len(argv) > 2 else argv[0]).name}.log", "w")
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        base = f"http://127.0.0.1:{spec['port']}"
        ready = _wait_for_model(base, spec["model"], procs, time.monotonic() + spec["timeout"])
        body = {"model": spec["model"], "messages": spec["messages"], "max_tokens": spec["max_tokens"]}
        chat = _get(f"{base}/v1/chat/completions", body, timeout=spec["timeout"])
        print(json.dumps({"ready_s": round(ready, 2), "chat": chat}), flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


if __name__ == "__main__":
    # Dynamo's packages behind another environment's own (dynamo.vllm on .venv-vllm's vLLM)
    sys.path += [p for p in os.environ.get("LPX_DYNAMO_PATH", "").split(os.pathsep) if p]
    {"parse": parse_main, "serve": serve_main}[sys.argv[1]]()
