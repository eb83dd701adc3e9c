"""Measuring one cell of `lpx tune`: build it through the stages (cached as always), serve it on loopback,
run the goodput search for every SLO, record memory; or measure a remote OpenAI-compatible server as it
is. A local cell's measurement is an artifact of the store (kind `tune`, beside the repository it
measured), keyed by the served repository's key, the measurement settings and this code, so an
interrupted tune resumes where it stopped and `lpx artifacts gc` sees it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..artifacts import Artifact, Store
from ..bench.load import ENGINE, LoadSpec, Run, run_closed, run_open
from ..bench.metrics import summarize
from ..bench.options import BenchOptions
from ..bench.target import declare, load_spec, vocab_of
from ..cache_keys import code_fingerprint, make_key
from ..config import Config
from .search import SearchSettings, search
from .space import Cell, cell_config

CODE = (
    "pipeline.tune.cells",
    "pipeline.tune.search",
    "pipeline.bench.load",
    "pipeline.bench.metrics",
    "pipeline.bench.options",
    "pipeline.bench.target",
)


@dataclass
class Measurement:
    """How every cell is measured (part of each cell's cache key)."""

    slos: list[dict[str, float]]
    input_len: int = 128
    output_len: int = 128
    requests: int = 32
    warmup: int = 4
    seed: int = 0
    search: SearchSettings = field(default_factory=SearchSettings)
    dataset: dict[str, Any] | None = (
        None  # {"path", "sha256", "prompts", "isl_mean"}: prompts instead of input_len
    )
    prompt_ids: tuple = field(default=(), repr=False)  # the dataset's prompts as token ids

    def bench_options(self, **where: Any) -> BenchOptions:
        """The `lpx bench` options of one cell's load: these lengths and seed, at `where` (url, model, ...)."""
        return BenchOptions(input_len=self.input_len, output_len=self.output_len, seed=self.seed, **where)

    def key_inputs(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("prompt_ids")  # the dataset's sha256 stands for them
        return out


def slo_label(slo: dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}ms" for k, v in slo.items()) or "none"


def level_runner(spec: LoadSpec, m: Measurement) -> Callable[[str, float], Run]:
    """(kind, load) -> the Run of that level; each load is measured once and shared by every SLO. A level
    counts at least twice as many requests as the highest concurrency tried so far, so a level at
    concurrency c (or a Poisson rate near its knee) fills c slots more than once."""
    runs: dict[tuple[str, float], Run] = {}
    most = [1]

    def run(kind: str, load: float) -> Run:
        if (kind, load) not in runs:
            if kind == "closed":
                most[0] = max(most[0], int(load))
                runs[kind, load] = run_closed(spec, int(load), max(m.requests, 2 * int(load)), None, m.warmup)
            else:
                runs[kind, load] = run_open(spec, load, max(m.requests, 2 * most[0]), 1.0, m.warmup)
        return runs[kind, load]

    return run


def search_all(spec: LoadSpec, m: Measurement, say: Callable[[str], None]) -> dict[str, Any]:
    """The goodput search per SLO over one served model; levels measured for one SLO serve the next."""
    run = level_runner(spec, m)
    out = {}
    for slo in m.slos:
        say(f"SLO {slo_label(slo)}")
        result = search(lambda kind, load, slo=slo: summarize(run(kind, load), slo), m.search, say)
        out[slo_label(slo)] = result.as_dict()
    return out


def process_tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def memory_in_use(server_pid: int | None) -> dict[str, Any]:
    """What the served cell holds: the GPUs' used memory when there are GPUs (the engine's weights and
    KV pool), else the resident memory of tritonserver and its model processes."""
    from ..facts.gpu import gpu_state

    state = gpu_state(full=False)
    if state is not None and state.gpus:
        return {"kind": "gpu", "gib": round(sum(g.used_mib for g in state.gpus) / 1024, 3)}
    if server_pid is None:
        return {"kind": "unknown", "gib": None}
    return {"kind": "host", "gib": round(process_tree_rss(server_pid) / 2**30, 3)}


STAGE = (
    "tune"  # the artifact store's kind for cell measurements: artifacts/tune/<model>/<variant>/<arch>/<key>/
)


def cell_slot(store: Store, model: str, repo: Artifact) -> Path:
    """Where a cell's measurement lives: beside the repository it measured (same variant and arch), so
    `lpx artifacts gc` removes it with that repository."""
    return store.slot(STAGE, model, repo.manifest["variant"], repo.manifest["arch"])


def save_cell(store: Store, slot: Path, inputs: dict[str, Any], doc: dict[str, Any], started: float) -> None:
    """The measurement as an artifact (its manifest's results), committed whole: a killed tune leaves no
    half-written cell. Called under the slot's lock."""
    with store.staging(slot, doc["key"]) as tmp:
        store.commit(
            tmp,
            slot / doc["key"],
            {
                "stage": STAGE,
                "model": slot.parent.parent.name,
                "variant": slot.parent.name,
                "arch": slot.name,
                "created": started,
                "duration_s": doc["measured_s"],
                "inputs": inputs,
                "results": doc,
            },
        )


def build_cell(cfg: Config, cell: Cell, report: Any) -> tuple[Config, Any, Artifact, Artifact]:
    """(the cell's config, its runner, engine, repository): the stages run (through their cache) for the
    GPU here when there is one."""
    from ..served import repository_of

    ccfg = cell_config(cfg, cfg.variant(cell.variant), cell.limits)
    if ccfg.target_of(ccfg.variant(cell.variant)) != "torch":  # build only for the GPU here: measured on it
        from ..facts.gpu import detect_gpu

        present = detect_gpu()
        if present is not None and present.arch in ccfg.build.archs:
            ccfg.build.archs = [present.arch]
    built = repository_of(ccfg, cell.variant, report, skip_gate=True)  # the gate ran before any cell
    return ccfg, built.runner, built.engine, built.repo


def measure_local(cfg: Config, cell: Cell, m: Measurement, report: Any, say: Callable[[str], None]) -> dict:
    """Build (through the stage cache), serve and search one cell; its cached measurement when there is one."""
    ccfg, runner, engine, repo = build_cell(cfg, cell, report)
    inputs = {"repo": repo.key, "measurement": m.key_inputs(), "code": code_fingerprint(CODE)}
    key = make_key(inputs)
    store = runner.ctx.store
    slot = cell_slot(store, cfg.model.name, repo)
    with store.lock(slot):
        store.sweep(slot)  # staging folders of killed tunes
        hit = store.lookup(STAGE, cfg.model.name, slot.parent.name, slot.name, key)
        if hit is not None:
            return {**hit.manifest["results"], "cached": True}
        started = time.time()
        doc = {"key": key, **serve_and_search(ccfg, cell, m, runner, repo, say)}
        doc["artifacts"] = {"engine": str(engine.path), "repo": str(repo.path), "repo_key": repo.key}
        save_cell(store, slot, inputs, doc, started)
    return {**doc, "cached": False}


def serve_and_search(
    ccfg: Config, cell: Cell, m: Measurement, runner: Any, repo: Artifact, say: Callable[[str], None]
) -> dict[str, Any]:
    """Serve the cell's repository on loopback and run the goodput search for every SLO on it."""
    from ..served import started

    t0 = time.perf_counter()
    with started(ccfg, cell.variant, repo, runner.report, gateway=False) as (srv, _):
        say(f"serving {cell.name} on {srv.grpc_url}")
        opts = m.bench_options(url=srv.grpc_url, model=ENGINE, protocol="grpc")
        spec = load_spec(opts, vocab=vocab_of(runner.ctx.checkpoint()[0].config), prompt_ids=m.prompt_ids)
        declare(spec)
        results = search_all(spec, m, say)
        memory = memory_in_use(srv.proc.pid if srv.proc else None)
    return {
        "cell": cell.as_dict(),
        "gpus": ccfg.build.tp_size * ccfg.build.pp_size if ccfg.build.target == "engine" else 1,
        "output_forced": spec.force_output,
        "memory": memory,
        "slo": results,
        "measured_s": round(time.perf_counter() - t0, 1),
        "finished_at": time.time(),
    }


def measure_remote(cell: Cell, m: Measurement, api_key: str | None, say: Callable[[str], None]) -> dict:
    """A server the user runs (vLLM, trtllm-serve, Dynamo, LPX's gateway), measured over OpenAI's API with
    the same search; nothing is built and nothing is cached (the server may change between runs)."""
    from ..client import api_key as find_key
    from ..client import served_model

    key = find_key(api_key)
    url = cell.url or ""
    opts = m.bench_options(
        url=url,
        api="openai",
        protocol="openai",
        model=served_model(url, key),
        endpoint="completions",
        api_key=key,
    )
    spec = load_spec(opts)
    t0 = time.perf_counter()
    results = search_all(spec, m, say)
    return {
        "key": None,
        "cell": cell.as_dict(),
        "gpus": None,
        "output_forced": False,
        "memory": {"kind": "unknown", "gib": None},
        "slo": results,
        "measured_s": round(time.perf_counter() - t0, 1),
        "finished_at": time.time(),
        "cached": False,
    }
