"""The serve stage: run Triton on a variant's repository, stream one completion and stop (`lpx run`), or
serve until stopped (`lpx serve`). Nothing is cached here: serving writes no artifact.

  __init__.py      preflight, which repository to serve, the smoke test and serve-until-stopped
  selection.py     which engine this machine may serve (GPU arch, TensorRT-LLM version)
  binary.py        finding tritonserver; the nvidia-pytriton wheel's backends and environment
  ranks.py         the MPI command line for an engine built for several GPUs
  tritonserver.py  the tritonserver child process: ports, readiness, clean stop
The OpenAI gateway `lpx serve` starts beside Triton is pipeline/gateway/.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.console import Console

from ...artifacts import Artifact, home
from ...config import Config
from ...demo import DEMO_PROMPT
from ...errors import LpxError, NotFound, StageFailed, UsageError
from ...progress import Reporter

SMOKE_TOKENS = 48


def preflight(cfg: Config) -> None:
    """Fail before quantizing anything when serving cannot work: no tritonserver, or a busy port."""
    server(cfg, "preflight", None).preflight()
    g = cfg.serving.openai
    if g.enabled and g.port:
        from .tritonserver import port_free

        host = g.host or cfg.serving.host
        if not port_free(host, g.port):
            raise LpxError(
                f"Port {g.port} on {host} is already in use - stop what holds it or set "
                "serving.openai.port to another port (0 picks a free one)"
            )


def server(cfg: Config, variant: str, repo: Artifact | None, report: Reporter | None = None):
    """A TritonServer (not started) on `repo` with the serving section's host, ports and timeouts; its
    notices (a restart after a known abort while loading) go to `report` when given, else to stderr."""
    from rich.markup import escape

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
        notify=(lambda message: report.warn(escape(message))) if report is not None else None,
    )


def world_size(cfg: Config) -> int:
    """GPUs (= Triton ranks) one engine needs: tp_size x pp_size for the engine target, else 1."""
    b = cfg.build
    return b.tp_size * b.pp_size if b.target == "engine" else 1


def serve_and_check(cfg: Config, variant: str, repo: Artifact, report: Reporter, out: Console) -> dict:
    """Start Triton, stream one completion over gRPC, print text, TTFT and tokens/s, stop."""
    from ...client import generate_stream

    triton = server(cfg, variant, repo, report)
    report.stage("serve", variant, "starting tritonserver")
    t0 = time.perf_counter()
    with triton:
        report.stage(
            "serve",
            variant,
            f"[green]ready[/green] in {time.perf_counter() - t0:.1f}s "
            f"(gRPC {triton.grpc_url}, HTTP {triton.http_url})",
        )
        out.print(f"[bold]prompt:[/bold] {DEMO_PROMPT}")
        out.print("[bold]output:[/bold] ", end="")
        start = time.perf_counter()
        chunks = []
        for chunk in generate_stream(
            triton.grpc_url, DEMO_PROMPT, SMOKE_TOKENS, model="ensemble", protocol="grpc"
        ):
            chunks.append(chunk)
            out.print(chunk.text, end="", markup=False, highlight=False)
        out.print()
    if not chunks:
        raise StageFailed(f"The server answered with no tokens - see the Triton log under {home() / 'logs'}")
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


def gateway(cfg: Config, triton, repo: Artifact):
    """The OpenAI gateway (not started) beside a started Triton, on the repository's tokenizer."""
    from ...gateway.process import GatewayProcess
    from ...gateway.settings import from_config

    settings = from_config(cfg, triton.grpc_url, repo.path / "preprocessing" / "1" / "tokenizer")
    return GatewayProcess(
        settings, home() / "run", home() / "logs" / f"gateway-{cfg.model.name}.log", ready_timeout_s=120
    )


def serve_forever_repo(cfg: Config, variant: str, repo: Artifact, report: Reporter) -> None:
    """Triton, and the OpenAI gateway beside it (serving.openai.enabled), until SIGINT/SIGTERM; on the
    signal the gateway drains its streams first (serving.openai.drain_timeout_s), then Triton stops."""
    from .tritonserver import serve_forever

    triton = server(cfg, variant, repo, report)
    with triton:
        openai = gateway(cfg, triton, repo).start() if cfg.serving.openai.enabled else None
        try:
            rec = _record_path()
            rec.parent.mkdir(parents=True, exist_ok=True)
            rec.write_text(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "grpc_url": triton.grpc_url,
                        "http_url": triton.http_url,
                        "metrics_url": triton.metrics_url,
                        "openai_url": openai.url if openai else None,
                        "repo": str(repo.path),
                        "model": cfg.model.name,
                        "variant": variant,
                    }
                )
            )
            extra = f", OpenAI API {openai.url}/v1" if openai else ""
            report.stage(
                "serve",
                variant,
                f"[green]ready[/green]: gRPC {triton.grpc_url}, HTTP {triton.http_url}, "
                f"metrics {triton.metrics_url}{extra} - Ctrl-C to stop",
            )
            try:
                serve_forever(triton, also=openai)
            finally:
                rec.unlink(missing_ok=True)
        finally:
            if openai is not None:
                report.stage("serve", variant, "draining the gateway's streams")
                openai.stop()
    report.stage("serve", variant, "stopped")


def running_server() -> dict:
    """The record 'lpx serve' writes while it runs."""
    try:
        info = json.loads(_record_path().read_text())
        os.kill(int(info["pid"]), 0)
        return info
    except (OSError, ValueError, KeyError):
        raise NotFound("No running 'lpx serve' found - start one, or pass --url HOST:PORT") from None


def serve(cfg: Config, outcomes: list, report: Reporter, out: Console, smoke: bool) -> None:
    """Serve what the runner built on this machine: `smoke` (lpx run) starts Triton on every variant's
    repository in turn, streams one completion and stops; otherwise (lpx serve) one variant until stopped.
    Refuses an engine of another arch or TensorRT-LLM version before Triton starts."""
    from .selection import choose

    chosen = {o.variant: pick[1] for o in outcomes if (pick := choose(o)) is not None}
    if not chosen:
        raise NotFound("Nothing to serve: no variant has a model repository - see the messages above")
    if smoke:
        for variant, repo in chosen.items():
            serve_and_check(cfg, variant, repo, report, out)
        return
    if len(chosen) != 1:
        raise UsageError(
            f"'lpx serve' serves one variant; pick one with --variant (have: {', '.join(chosen)})"
        )
    ((variant, repo),) = chosen.items()
    serve_forever_repo(cfg, variant, repo, report)
