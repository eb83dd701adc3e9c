"""scripts/bench_gateway_ab.py's paired A/B of two gateway checkouts on one toy Triton (loopback): both
gateways at once, each importing `pipeline` from its own checkout, against the same toy `tensorrt_llm`
(answers at once); the paired median TTFT of B - A, then tokens per second of each gateway's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .gateway_bench import MODEL, TOY_IDS, start_gateway
from .gateway_clients import GatewayPath, TritonPath, gather_limited
from .options import parse_levels

WARMUP = 30  # rounds left out of the TTFT figures


def start_from(checkout: Path, triton_url: str, tokenizer: Path, work: Path, name: str):
    """A gateway process importing `pipeline` from `checkout`."""
    old_path, old_cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    os.environ["PYTHONPATH"] = str(checkout.resolve())
    os.chdir(checkout)
    try:
        return start_gateway(triton_url, tokenizer, work, name)
    finally:
        os.chdir(old_cwd)
        if old_path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old_path


async def compare(triton_url: str, gws: dict, rounds: int, levels: list[int]) -> None:
    """TTFT rounds of direct / A / B (the order reversed every other round), then each level's throughput."""
    body = {"model": MODEL, "prompt": TOY_IDS, "max_tokens": 4, "stream": True}
    engine = {
        "input_ids": np.array([TOY_IDS], np.int32),
        "input_lengths": np.array([[len(TOY_IDS)]], np.int32),
        "request_output_len": np.array([[4]], np.int32),
        "streaming": np.array([[True]]),
    }
    paths = {"direct": TritonPath(triton_url, "tensorrt_llm", engine)}
    paths.update({name: GatewayPath(gw.url, body) for name, gw in gws.items()})
    got: dict[str, list[float]] = {k: [] for k in paths}
    for i in range(rounds + WARMUP):
        for name, path in list(paths.items())[:: 1 if i % 2 == 0 else -1]:
            t = await path.ttft()
            if i >= WARMUP:
                got[name].append(t)
    for path in paths.values():
        await path.close()
    print("\n".join(paired_lines(got)))
    stream = dict(body, max_tokens=128, stream_options={"include_usage": True})
    for level in levels:
        for name, gw in [*gws.items()] * 2:
            await throughput(name, gw, stream, level)


def paired_lines(got: dict[str, list[float]]) -> list[str]:
    """Each path's TTFT p50 and what it adds over `direct` (paired: the same round), then B - A, paired
    (`got`: path -> seconds per round, "direct", "A" and "B" among them)."""
    base = got["direct"]
    lines = []
    for name, xs in got.items():
        paired = statistics.median(x - b for x, b in zip(xs, base, strict=True)) * 1e3
        lines.append(
            f"{name:7} TTFT p50 {statistics.median(xs) * 1e3:.3f} ms, added over direct (paired) {paired:.3f}"
        )
    diff = statistics.median(b - a for a, b in zip(got["A"], got["B"], strict=True)) * 1e3
    lines.append(f"B - A, paired median: {diff:.3f} ms")
    return lines


async def throughput(name: str, gw, stream: dict, level: int) -> None:
    """2 x `level` streams through one gateway, `level` at a time, after a warm-up: tokens per CPU second."""
    import psutil

    client, proc = GatewayPath(gw.url, stream), psutil.Process(gw.proc.pid)
    await gather_limited(client.stream_tokens, level, level)
    c0, t0 = proc.cpu_times(), time.perf_counter()
    n = sum(await gather_limited(client.stream_tokens, 2 * level, level))
    c1, wall = proc.cpu_times(), time.perf_counter() - t0
    await client.close()
    cpu = c1.user + c1.system - c0.user - c0.system
    print(f"{level} streams, {name}: {n / cpu:,.0f} tokens / gateway CPU-s, {n / wall:,.0f} / wall-s")


def run(args: argparse.Namespace) -> int:
    from ..demo import write_checkpoint
    from ..servers.tritonserver import TritonServer
    from .toy import write_toy_repo

    work = Path(tempfile.mkdtemp(prefix="lpx-gateway-ab-"))
    os.environ.setdefault("LPX_HOME", str(work / "home"))
    write_checkpoint(work / "checkpoint")
    repo = write_toy_repo(work / "toy-repo", 0, 0, first_id=300, id_span=200)
    with TritonServer(repo, log_path=work / "toy-triton.log", ready_timeout_s=120) as srv:
        gws = {
            name: start_from(checkout, srv.grpc_url, work / "checkpoint", work, name)
            for name, checkout in (("A", args.a), ("B", args.b))
        }
        try:
            levels = parse_levels(args.concurrency)
            asyncio.run(compare(srv.grpc_url, gws, args.rounds, levels))
        finally:
            for gw in gws.values():
                gw.stop()
    return 0
