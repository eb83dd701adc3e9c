"""The gateway as a process: `python -m pipeline.gateway SETTINGS.json` runs uvicorn on the app
(uvloop and httptools where installed), and `GatewayProcess` starts, waits for and stops that child the
way tritonserver.py does for Triton.

Connections go through transport.py's protocol (header size limit, header and body read timeouts,
before any request reaches the application). SIGTERM (or SIGINT) makes uvicorn stop accepting
connections and lets in-flight requests finish for up to `drain_timeout_s`; then DrainingServer ends
what is left - each cancel closes its gRPC call, and the Gate answers it (503, or an SSE error event and
`data: [DONE]`) and logs it - and only once every request has ended does the application shut down (the
access log closed last). `lpx serve` stops the gateway first and Triton after it, so draining streams
still have their engine.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..errors import LpxError, StageFailed
from .settings import GatewaySettings

log = logging.getLogger("lpx.gateway")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LpxError(
            f"The gateway cannot bind {host}:{port} ({exc.strerror}) - stop what holds the port or set "
            "serving.openai.port to another (0 picks a free one)"
        ) from None
    sock.set_inheritable(True)
    return sock


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


GIVE_UP_S = 5.0  # after the drain time, how long cancelled requests get to write their end


def draining_server(config: Any, gate: Any, drain_timeout_s: float) -> Any:
    """A uvicorn.Server whose shutdown, once `drain_timeout_s` has passed, cancels the requests still
    running with `gate.drained` set (the Gate ends each in the client's terms) and waits for them to end
    before the application's shutdown; a request that does not end within GIVE_UP_S more is abandoned."""
    import asyncio

    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets: list | None = None) -> None:
            loop = asyncio.get_running_loop()
            timers = [
                loop.call_later(drain_timeout_s, self._drain_over),
                loop.call_later(drain_timeout_s + GIVE_UP_S, self._give_up),
            ]
            try:
                await super().shutdown(sockets)
            finally:
                for timer in timers:
                    timer.cancel()

        def _drain_over(self) -> None:
            tasks = list(self.server_state.tasks)
            if tasks:
                log.warning(
                    "drain_timeout_s (%g s) ran out: ending %d request(s) still running",
                    drain_timeout_s,
                    len(tasks),
                )
            gate.drained = True
            for task in tasks:
                task.cancel("drain_timeout_s ran out")

        def _give_up(self) -> None:
            log.error("requests still running %g s after the drain ended: exiting without them", GIVE_UP_S)
            self.force_exit = True

    return DrainingServer(config)


def run(settings: GatewaySettings, ready_file: Path | None = None) -> None:
    """Serve until SIGTERM/SIGINT (blocking). Writes {"port", "pid"} to `ready_file` once listening."""
    import asyncio

    import uvicorn

    from .app import create_app

    logging.basicConfig(level=logging.INFO, format="gateway: %(message)s", stream=sys.stderr)
    if not _installed("httptools"):
        raise LpxError("The gateway needs httptools (an LPX dependency) - reinstall LPX: pip install -e .")
    from .transport import strict_protocol

    sock = _bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    app = create_app(settings)
    s = settings
    config = uvicorn.Config(
        app,
        loop="uvloop" if _installed("uvloop") else "asyncio",
        http=strict_protocol(s.max_header_bytes, s.header_timeout_s, s.body_timeout_s, app.metrics),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=None,  # DrainingServer ends what runs at drain_timeout_s
        timeout_keep_alive=30,
        backlog=4096,
    )
    server = draining_server(config, app, settings.drain_timeout_s)
    # uvicorn restores these after its graceful shutdown and re-raises the signal it caught: a no-op here
    # makes a drained SIGTERM / SIGINT a clean exit (code 0) instead of death by the signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)

    async def main() -> None:
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            host = settings.host if ":" not in settings.host else f"[{settings.host}]"
            logging.getLogger("lpx.gateway").info(
                "listening on http://%s:%d (model %s, Triton %s)",
                host,
                port,
                settings.model_name,
                settings.triton_url,
            )
            if ready_file is not None:
                write_atomic(ready_file, json.dumps({"port": port, "pid": os.getpid()}))
        await task

    if config.loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m pipeline.gateway SETTINGS.json [READY_FILE]", file=sys.stderr)
        return 2
    try:
        settings = GatewaySettings.model_validate_json(Path(args[0]).read_text(encoding="utf-8"))
        run(settings, Path(args[1]) if len(args) > 1 else None)
    except LpxError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


class GatewayProcess:
    """The gateway as a child process (own session, SIGTERM'd if its parent dies)."""

    def __init__(
        self, settings: GatewaySettings, folder: Path, log_path: Path, ready_timeout_s: float = 60.0
    ):
        self.settings = settings
        self.folder = Path(folder)
        self.log_path = Path(log_path)
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = self.settings.host
        host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def start(self) -> GatewayProcess:
        from ..servers.child import log_tail, spawn

        self.folder.mkdir(parents=True, exist_ok=True)
        settings_file = self.folder / f"gateway-{os.getpid()}.json"
        ready = self.folder / f"gateway-{os.getpid()}.ready"
        ready.unlink(missing_ok=True)
        write_atomic(settings_file, self.settings.model_dump_json(indent=2), mode=0o600)
        env = dict(os.environ)
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        argv = [sys.executable, "-m", "pipeline.gateway", str(settings_file), str(ready)]
        self.proc = spawn(argv, self.log_path, env, append=True)
        deadline = time.monotonic() + self.ready_timeout_s
        while not ready.exists():
            code = self.proc.poll()
            if code is not None or time.monotonic() > deadline:
                self.stop()
                why = (
                    f"exited with code {code}"
                    if code is not None
                    else f"not listening after {self.ready_timeout_s:.0f} s"
                )
                raise StageFailed(
                    f"The OpenAI gateway {why} - see its log ({self.log_path})",
                    detail=log_tail(self.log_path),
                )
            time.sleep(0.05)
        self.port = int(json.loads(ready.read_text())["port"])
        ready.unlink(missing_ok=True)
        self._wait_live(deadline)
        return self

    def _wait_live(self, deadline: float) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            try:
                with opener.open(f"{self.url}/health/live", timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise StageFailed(f"The OpenAI gateway at {self.url} does not answer - see {self.log_path}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM (streams drain for up to drain_timeout_s), then SIGKILL if it still runs. Its exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        from ..servers.child import stop

        return stop(proc, grace_s=self.settings.drain_timeout_s + GIVE_UP_S + 10)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
