"""scripts/bench_vllm.py's run: LPX's vllm target through its gateway, vLLM's own OpenAI server on the same
build folder and LPX's torch target, side by side on this machine; rounds that alternate the servers' order,
the CPU each server's tree spent per output token, and with --trace where a token waits (the script's
docstring says what each flag does; docs/vllm.md has the figures).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from ..errors import UsageError
from .cpus import cpu_s, cpu_table, parse_cpus, pin_hops
from .vllm_measure import aiperf, bench, table, trace_run, vllm_own_path
from .vllm_servers import Fleet, chosen_servers, start_servers

PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)


def run(args: argparse.Namespace) -> int:
    """The whole run: servers up, the rounds, the tables printed and written to OUT/table.md, servers down."""
    from ..demo import write_checkpoint

    pin = parse_cpus(args.pin) if args.pin else None
    chosen = chosen_servers(args.servers)
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LPX_HOME": str(work / "home")}
    checkpoint = args.checkpoint.resolve() if args.checkpoint else work / "checkpoint"
    if not checkpoint.is_dir():
        if args.checkpoint:
            raise UsageError(
                f"--checkpoint {checkpoint}: no such folder - pass a Hugging Face checkpoint folder"
            )
        write_checkpoint(checkpoint)
    fleet = Fleet()
    try:
        start_servers(fleet, chosen, work, env, checkpoint, args.trace)
        if pin is not None:
            for name, pid in fleet.pids().items():
                if name.startswith("lpx-"):
                    print(
                        f"{name}: pinned to CPUs {sorted(pin)}: {', '.join(pin_hops(pid, pin))}", flush=True
                    )
        text = "" if args.no_bench else rounds(args, fleet, work, env, checkpoint)
        text += traces(args, fleet)
        (work / "table.md").write_text(text + "\n")
        print(text)
    finally:
        fleet.stop()
        shutil.rmtree(work / "home" / "tmp", ignore_errors=True)
    return 0


def rounds(args: argparse.Namespace, fleet: Fleet, work: Path, env: dict, checkpoint: Path) -> str:
    """--rounds rounds of `lpx bench` (and AIPerf) on each server, the order reversed every other round:
    the table of medians and the CPU table."""
    pids = fleet.pids()
    cpu: dict[str, list[dict]] = {name: [] for name in fleet.servers}
    results: dict[str, list[dict]] = {name: [] for name in fleet.servers}
    for r in range(args.rounds):
        order = list(fleet.servers) if r % 2 == 0 else list(reversed(fleet.servers))
        for name in order:
            out = work / "runs" / f"{r}-{name}"
            before = {n: cpu_s(pid) for n, pid in pids.items()}
            results[name].append(bench(fleet.servers[name], out, args.levels, args.requests, env, checkpoint))
            after = {n: cpu_s(pid) for n, pid in pids.items()}
            cpu[name].append(cpu_used(name, before, after, results[name][-1]))
            if args.aiperf:
                tool = work / "runs" / f"{r}-{name}-aiperf"
                doc = aiperf(args.aiperf, fleet.servers[name], tool, args.levels, args.requests, checkpoint)
                results.setdefault(f"{name} (AIPerf)", []).append(doc)
    return table(results) + "\n\n" + cpu_table(cpu)


def cpu_used(name: str, before: dict[str, dict], after: dict[str, dict], doc: dict) -> dict:
    """One server's run for cpu_table: its tree's CPU seconds by role (`before`/`after`: cpu_s of every
    server), the tokens it streamed (results.json `doc`; the warm-up requests ran too, as long) and the CPU
    seconds the idle servers spent meanwhile."""
    used = {n: {k: v - before[n].get(k, 0.0) for k, v in after[n].items()} for n in after}
    runs = doc["results"]
    tokens = sum((r["succeeded"] + r["load"]["warmup"]) * r["osl"]["mean"] for r in runs)
    idle = sum(sum(u.values()) for n, u in used.items() if n != name)
    return {"own": used[name], "tokens": tokens, "idle": idle}


def traces(args: argparse.Namespace, fleet: Fleet) -> str:
    """--trace's tables: each LPX server's hops, then vLLM's own server split by its /metrics."""
    text = ""
    for name, folder in fleet.traces.items():
        text += f"\n\n{name}: where a token waits (LPX_TRACE)\n\n"
        text += trace_run(fleet.servers[name], folder, args.levels, PROMPT, args.trace_requests)
    if args.trace and "vllm-own" in fleet.servers:
        text += "\n\nvllm-own: the request's path to its first token (vLLM's /metrics)\n\n"
        text += vllm_own_path(fleet.servers["vllm-own"], args.levels, PROMPT, args.trace_requests)
    return text
