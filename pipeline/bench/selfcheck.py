"""scripts/bench_selfcheck.py's check of the load generator against a server that stamps its own answer
times: a real tritonserver on the fixed-delay toy `tensorrt_llm` (pipeline/bench/toy.py), whose `emit_ns`
stamps (time.time_ns() right before each send, the client's clock too) are the truth the client's TTFT and
ITL are held to, within 5% or 1 ms, at every level.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from .load import Record
from .options import parse_levels

HEAD = (
    "| conc | reqs | failed | TTFT client | TTFT truth | diff | ITL client | ITL truth | diff "
    "| TTFT p99 | ITL p99 | out tok/s | client CPU s | client CPU % | verdict |"
)


def within(measured: float, truth: float) -> bool:
    return abs(measured - truth) <= max(0.05 * truth, 1.0)


def truth(rec: Record) -> tuple[float, float | None] | None:
    """(TTFT, ITL) in ms from the server's emit stamps; None when the server sent none."""
    if rec.error is not None or not rec.emits_ns or len(rec.emits_ns) != len(rec.times):
        return None
    ttft = (rec.emits_ns[0] - rec.sent_ns) / 1e6
    osl = int(sum(rec.tokens))
    itl = (rec.emits_ns[-1] - rec.emits_ns[0]) / 1e6 / (osl - 1) if osl > 1 else None
    return ttft, itl


def run(args: argparse.Namespace) -> int:
    """Every level against the toy; the table; 0 when every level kept within the bounds, else 1."""
    from ..servers.tritonserver import TritonServer
    from .load import LoadSpec
    from .toy import write_toy_repo

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_toy_repo(Path(tmp) / "repo", args.first_ms, args.every_ms)
        with TritonServer(repo, ready_timeout_s=60) as server:
            url = server.grpc_url if args.protocol == "grpc" else server.http_url
            spec = LoadSpec(
                url=url,
                model="tensorrt_llm",
                protocol=args.protocol,
                input_len=64,
                output_len=args.output_len,
            )
            print(
                f"cores: {os.cpu_count()}  schedule: TTFT {args.first_ms:.1f} ms, ITL {args.every_ms:.1f} ms, "
                f"OSL {args.output_len}  protocol: {args.protocol}  truth: server emit stamps"
            )
            print(HEAD)
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for level in parse_levels(args.levels, "--levels"):
                ok &= check_level(spec, level, args)
    print("self-check passed" if ok else "self-check FAILED")
    return 0 if ok else 1


def check_level(spec, level: int, args: argparse.Namespace) -> bool:
    """One level's closed-loop run against the toy; its table row; whether it kept within the bounds."""
    from .load import run_closed

    n = args.requests_per_level or max(16, 2 * level)
    done = run_closed(spec, level, n, warmup=min(level, 16))
    line, good = level_row(done, level, args.output_len)
    print(line)
    return good


def level_row(done, level: int, output_len: int) -> tuple[str, bool]:
    """A run's table row (the client's mean TTFT and ITL beside the truth) and whether it passed: no
    failure, both within the bounds, every answer `output_len` tokens long."""
    from .metrics import request_metrics, summarize

    r = summarize(done)
    pairs = [
        (m, t)
        for m, t in ((request_metrics(x), truth(x)) for x in done.records)
        if m is not None and t is not None
    ]
    if not r["ttft_ms"] or not r["itl_ms"] or len(pairs) != r["succeeded"]:
        why = r["errors"][:1] or ["responses carry no emit_ns"]
        return (
            f"| {level} | {r['requests']} | {r['failed']} | - | - | - | - | - | - | - | - | - | - | - | FAIL {why} |",
            False,
        )
    c_ttft = float(np.mean([m.ttft_ms for m, _ in pairs]))
    t_ttft = float(np.mean([t[0] for _, t in pairs]))
    c_itl = float(np.mean([m.itl_ms for m, _ in pairs if m.itl_ms is not None]))
    t_itl = float(np.mean([t[1] for _, t in pairs if t[1] is not None]))
    good = (
        r["failed"] == 0
        and within(c_ttft, t_ttft)
        and within(c_itl, t_itl)
        and r["osl"]["min"] == r["osl"]["max"] == output_len
    )
    line = (
        f"| {level} | {r['requests']} | {r['failed']} | {c_ttft:.2f} | {t_ttft:.2f} | {c_ttft - t_ttft:+.2f} "
        f"| {c_itl:.2f} | {t_itl:.2f} | {c_itl - t_itl:+.2f} | {r['ttft_ms']['p99']:.2f} "
        f"| {r['itl_ms']['p99']:.2f} | {r['output_tokens_per_s']:.0f} | {r['client_cpu_s']:.2f} "
        f"| {r['client_cpu_util']:.0%} | {'ok' if good else 'MISS'} |"
    )
    return line, good
