"""Serving glue for the CLI: run Triton on a repository artifact, smoke-test it, or serve until stopped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.console import Console

from ...artifacts import Artifact, home
from ...config import Config
from ...demo import DEMO_PROMPT
from ...errors import PipelineError
from ...progress import Reporter

SMOKE_TOKENS = 48


def preflight(cfg: Config) -> None:
    """Fail before quantizing anything when serving cannot work: no tritonserver, or a busy port."""
    _server(cfg, "preflight", None).preflight()


def _server(cfg: Config, variant: str, repo: Artifact | None):
    from .tritonserver import TritonServer

    s = cfg.serving
    log = home() / "logs" / f"triton-{cfg.model.name}-{variant}.log"
    if repo is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    return TritonServer(
        repo.path if repo else Path("."),
        host=s.host,
        http_port=s.http_port,
        grpc_port=s.grpc_port,
        metrics_port=s.metrics_port,
        log_path=log,
        ready_timeout_s=s.ready_timeout_s,
        world_size=world_size(cfg),
    )


def world_size(cfg: Config) -> int:
    """GPUs (= Triton ranks) one engine needs: tp_size x pp_size for the engine target, else 1."""
    b = cfg.build
    return b.tp_size * b.pp_size if b.target == "engine" else 1


def serve_and_check(cfg: Config, variant: str, repo: Artifact, report: Reporter, out: Console) -> dict:
    """Start Triton, stream one completion over gRPC, print text, TTFT and tokens/s, stop."""
    from ...client import generate_stream

    server = _server(cfg, variant, repo)
    report.stage("serve", variant, "starting tritonserver")
    t0 = time.perf_counter()
    with server:
        report.stage(
            "serve",
            variant,
            f"[green]ready[/green] in {time.perf_counter() - t0:.1f}s "
            f"(gRPC {server.grpc_url}, HTTP {server.http_url})",
        )
        out.print(f"[bold]prompt:[/bold] {DEMO_PROMPT}")
        out.print("[bold]output:[/bold] ", end="")
        start = time.perf_counter()
        chunks = []
        for chunk in generate_stream(
            server.grpc_url, DEMO_PROMPT, SMOKE_TOKENS, model="ensemble", protocol="grpc"
        ):
            chunks.append(chunk)
            out.print(chunk.text, end="", markup=False, highlight=False)
        out.print()
    if not chunks:
        raise PipelineError(
            f"The server answered with no tokens - see the Triton log under {home() / 'logs'}"
        )
    ttft = chunks[0].t - start
    total = chunks[-1].t - start
    rate = (len(chunks) - 1) / (total - ttft) if len(chunks) > 1 and total > ttft else float("nan")
    out.print(
        f"[bold]TTFT[/bold] {ttft * 1000:.0f} ms, [bold]{rate:.1f} tokens/s[/bold] after the first "
        f"({len(chunks)} chunks in {total:.2f}s); server stopped"
    )
    return {"ttft_s": ttft, "total_s": total, "chunks": len(chunks)}


def _record_path() -> Path:
    return home() / "run" / "server.json"


def serve_forever_repo(cfg: Config, variant: str, repo: Artifact, report: Reporter) -> None:
    from .tritonserver import serve_forever

    server = _server(cfg, variant, repo)
    with server:
        rec = _record_path()
        rec.parent.mkdir(parents=True, exist_ok=True)
        rec.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "grpc_url": server.grpc_url,
                    "http_url": server.http_url,
                    "metrics_url": server.metrics_url,
                    "repo": str(repo.path),
                    "model": cfg.model.name,
                    "variant": variant,
                }
            )
        )
        report.stage(
            "serve",
            variant,
            f"[green]ready[/green]: gRPC {server.grpc_url}, HTTP {server.http_url}, "
            f"metrics {server.metrics_url} - Ctrl-C to stop",
        )
        try:
            serve_forever(server)
        finally:
            rec.unlink(missing_ok=True)
    report.stage("serve", variant, "stopped")


def running_server() -> dict:
    """The record 'lpx serve' writes while it runs."""
    try:
        info = json.loads(_record_path().read_text())
        os.kill(int(info["pid"]), 0)
        return info
    except (OSError, ValueError, KeyError):
        raise PipelineError(
            "No running 'lpx serve' found - start one, or pass --url HOST:PORT", exit_code=1
        ) from None
