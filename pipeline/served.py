"""Serving a variant: the one place that composes "run the stages to its repository -> choose the
repository for this machine -> start Triton (and the OpenAI gateway beside it) -> stop both". `lpx run`
(one completion per variant, then stop), `lpx serve` (until stopped; also `--repo DIR` without lpx.yaml),
`lpx bench -c` and `lpx tune` all serve through it. Nothing is cached here: serving writes no artifact;
the processes themselves are pipeline/servers/ (tritonserver) and pipeline/gateway/ (the gateway).

  repository_of  run the stages up to `repo` for one variant and pick what this machine serves
  started        Triton on a repository, and the gateway when asked; both stopped on exit
  served         the two together: what `lpx bench -c` measures
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from .artifacts import Artifact, home
from .config import Config, parse_config
from .demo import DEMO_PROMPT
from .errors import LpxError, NotFound, StageFailed, UsageError
from .progress import Reporter
from .runtime.engines.vllm_engine import MODEL_FILE as VLLM_FILE
from .runtime.engines.vllm_engine import read_build as read_vllm_build
from .servers.repository import choose_repository, engine_of

SMOKE_TOKENS = 48


def preflight(cfg: Config) -> None:
    """Fail before quantizing anything when serving cannot work: no tritonserver, or a busy port."""
    server(cfg, "preflight", None).preflight()
    if any(cfg.for_variant(v).build.target == "vllm" for v in cfg.variants):
        from .runtime.engines.vllm_engine import find_python

        find_python()  # vLLM's environment: missing, the error names 'make vllm'
    g = cfg.serving.openai
    if g.enabled and g.port:
        from .servers.child import port_free

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

    from .servers.tritonserver import TritonServer

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
        world_size=world_size(cfg, variant),
        notify=(lambda message: report.warn(escape(message))) if report is not None else None,
        echo=s.log_stdout,
    )


def world_size(cfg: Config, variant: str | None = None) -> int:
    """GPUs (= Triton ranks) one engine of `variant` needs: tp_size x pp_size for the engine target (the
    variant's own target where it sets one), else 1."""
    known = variant is not None and any(v.name == variant for v in cfg.variants)
    return (cfg.for_variant(cfg.variant(variant)) if known else cfg).build.ranks


def serve_and_check(cfg: Config, variant: str, repo: Artifact, report: Reporter, out: Console) -> dict:
    """Start Triton, stream one completion over gRPC, print text, TTFT and tokens/s, stop. With
    serving.run_question (and the gateway enabled) the gateway starts too and the question is asked as
    one chat message through /v1/chat/completions: the answer shows the chat template and the end of
    sequence work, as a client would see them."""
    if cfg.serving.run_question and cfg.serving.openai.enabled:
        return _ask(cfg, variant, repo, report, out, cfg.serving.run_question)
    from .client import generate_stream

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
    return _smoke_figures(chunks, start, out)


def _ask(cfg: Config, variant: str, repo: Artifact, report: Reporter, out: Console, question: str) -> dict:
    """Triton and the gateway on `repo`; `question` streamed through /v1/chat/completions; both stopped."""
    from .client import api_key, openai_stream

    with started(cfg, variant, repo, report, gateway=True) as (_triton, openai):
        out.print(f"[bold]question:[/bold] {question}")
        out.print("[bold]answer:[/bold] ", end="")
        start = time.perf_counter()
        chunks = []
        for chunk in openai_stream(openai.url, question, SMOKE_TOKENS, chat=True, api_key=api_key(None)):
            chunks.append(chunk)
            out.print(chunk.text, end="", markup=False, highlight=False)
        out.print()
    return _smoke_figures(chunks, start, out)


def _smoke_figures(chunks: list, start: float, out: Console) -> dict:
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


@dataclass
class Built:
    """A variant's stages run to its repository: the engine and repository this machine serves, the
    runner's outcome (every artifact's key) and the runner (its context: the store, the checkpoint)."""

    engine: Artifact
    repo: Artifact
    outcome: Any
    runner: Any


@dataclass
class Served:
    """A built variant being served: the running Triton and the gateway beside it (or None)."""

    built: Built
    triton: Any
    openai: Any = None


def repository_of(cfg: Config, variant: str, report: Reporter, skip_gate: bool = False) -> Built:
    """The stages run (through their cache) up to `repo` for one variant, and the repository this
    machine serves picked from what they built."""
    from .runner import Runner
    from .servers.selection import choose

    runner = Runner(cfg, report, skip_gate=skip_gate)
    outcome = runner.run([cfg.variant(variant)], "repo")[0]
    runner.raise_gate_failures()
    picked = choose(outcome)
    if picked is None:
        raise StageFailed(f"variant '{variant}' has no model repository to serve - see the messages above")
    return Built(*picked, outcome, runner)


@contextlib.contextmanager
def started(
    cfg: Config, variant: str, repo: Artifact, report: Reporter, gateway: bool | None = None
) -> Iterator[tuple[Any, Any]]:
    """(triton, openai): Triton on `repo` with the serving section's settings and, when `gateway` (default
    serving.openai.enabled), the OpenAI gateway beside it; the gateway drains and stops first, then Triton."""
    triton = server(cfg, variant, repo, report)
    with triton:
        use = cfg.serving.openai.enabled if gateway is None else gateway
        openai = gateway_process(cfg, triton, repo).start() if use else None
        extra = f", OpenAI API {openai.url}/v1" if openai else ""
        report.stage("serve", variant, f"ready: gRPC {triton.grpc_url}, HTTP {triton.http_url}{extra}")
        try:
            yield triton, openai
        finally:
            if openai is not None:
                report.stage("serve", variant, "draining the gateway's streams")
                openai.stop()


@contextlib.contextmanager
def served(
    cfg: Config, variant: str, report: Reporter, gateway: bool | None = None, skip_gate: bool = False
) -> Iterator[Served]:
    """One variant built through the stage cache and served on this machine until the block ends."""
    built = repository_of(cfg, variant, report, skip_gate)
    with started(cfg, variant, built.repo, report, gateway) as (triton, openai):
        yield Served(built, triton, openai)


def _record_path() -> Path:
    return home() / "run" / "server.json"


def gateway_process(cfg: Config, triton, repo: Artifact):
    """The OpenAI gateway (not started) beside a started Triton, on the repository's tokenizer."""
    from .gateway.process import GatewayProcess
    from .gateway.settings import from_config

    settings = from_config(cfg, triton.grpc_url, repo.path / "preprocessing" / "1" / "tokenizer")
    return GatewayProcess(
        settings, home() / "run", home() / "logs" / f"gateway-{cfg.model.name}.log", ready_timeout_s=120
    )


def serve_forever_repo(cfg: Config, variant: str, repo: Artifact, report: Reporter) -> None:
    """Triton, and the OpenAI gateway beside it (serving.openai.enabled), until SIGINT/SIGTERM; on the
    signal the gateway drains its streams first (serving.openai.drain_timeout_s), then Triton stops."""
    from .servers.tritonserver import serve_forever

    with started(cfg, variant, repo, report) as (triton, openai):
        rec = _record_path()
        rec.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "pid": os.getpid(),
            "grpc_url": triton.grpc_url,
            "http_url": triton.http_url,
            "metrics_url": triton.metrics_url,
            "openai_url": openai.url if openai else None,
            "repo": str(repo.path),
            "model": cfg.model.name,
            "variant": variant,
        }
        rec.write_text(json.dumps(record))
        report.stage("serve", variant, f"metrics {triton.metrics_url} - Ctrl-C to stop")
        try:
            serve_forever(triton, also=openai)
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
        raise NotFound("No running 'lpx serve' found - start one, or pass --url HOST:PORT") from None


def serve(cfg: Config, outcomes: list, report: Reporter, out: Console, smoke: bool) -> None:
    """Serve what the runner built on this machine: `smoke` (lpx run) starts Triton on every variant's
    repository in turn, streams one completion and stops; otherwise (lpx serve) one variant until stopped.
    Refuses an engine of another arch or TensorRT-LLM version before Triton starts."""
    from .servers.selection import choose

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


def packaged_config(repo: Artifact, host: str | None, gateway: bool, ports: dict[str, int] | None = None):
    """The Config a packaged repository is served with: its model and variant names, the target and GPU
    count its engine was built for, serving defaults (host as asked)."""
    engine = engine_of(repo)
    target = (engine.manifest.get("inputs") or {}).get("target")
    if isinstance(target, dict):  # torch and llmapi builds record {"target": ...} among their inputs
        target = target.get("target")
    if target not in ("engine", "llmapi", "torch", "vllm"):
        target = "engine" if repo.manifest.get("results", {}).get("backend") == "tensorrtllm" else "torch"
        target = "vllm" if (engine.path / VLLM_FILE).is_file() else target
    ranks = len(list(engine.path.glob("rank*.engine"))) if target == "engine" else 1
    variant: dict[str, Any] = {"name": repo.manifest["variant"]}
    build: dict[str, Any] = {"target": target, "tp_size": max(ranks, 1)}
    if target == "vllm":  # vLLM's own parallelism and the format it loads, as its build folder says
        meta = read_vllm_build(engine.path)
        variant["quantization"] = {
            "format": meta.get("format") or "none",
            "kv_cache": meta.get("kv_cache") or "none",
        }
        build["tp_size"] = int(meta["engine_args"].get("tensor_parallel_size") or 1)
        build["eager"] = bool(meta["engine_args"].get("enforce_eager"))
    data = {
        "model": {"name": repo.manifest["model"], "checkpoint": str(repo.path)},
        "variants": [variant],
        "build": build,
        "serving": {
            "host": host or "127.0.0.1",
            **{f"{k}_port": v for k, v in (ports or {}).items() if k != "openai"},
        },
    }
    cfg = parse_config(data, source=f"--repo {repo.path}")
    cfg.serving.openai.enabled = gateway
    if ports and "openai" in ports:
        cfg.serving.openai.port = ports["openai"]
    return cfg


def serve_packaged(
    folder: Path,
    variant: str | None,
    model: str | None,
    host: str | None,
    gateway: bool,
    ports: dict[str, int] | None = None,
    log_stdout: bool = False,
) -> None:
    """`lpx serve --repo DIR`: serve the repository built for this GPU until SIGINT/SIGTERM."""
    repo = choose_repository(folder, variant, model)
    cfg = packaged_config(repo, host, gateway, ports)
    cfg.serving.log_stdout = log_stdout
    if cfg.build.target == "vllm":
        from .runtime.engines.vllm_engine import find_python

        find_python()  # before Triton starts: a missing vLLM environment names 'make vllm'
    report = Reporter()
    report.info(
        f"serving {repo.path} ({repo.manifest['model']}/{repo.manifest['variant']}, {repo.manifest['arch']})"
    )
    serve_forever_repo(cfg, repo.manifest["variant"], repo, report)
