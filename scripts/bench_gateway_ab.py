"""Paired A/B of two gateway checkouts on one toy Triton (loopback), for changes smaller than the
run-to-run spread of scripts/bench_gateway.py on a shared machine.

Both gateways run at once, each from its own checkout (PYTHONPATH), against the same toy `tensorrt_llm`
(answers at once). TTFT: --rounds rounds of direct / A / B streamed 4-token requests, the order reversed
every other round; the paired median of B - A. Throughput: --concurrency streams of 128 tokens through A,
then B, twice: tokens per second of each gateway process's CPU.

    git worktree add --detach /tmp/base <commit>
    python scripts/bench_gateway_ab.py --a /tmp/base --b .
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from bench_gateway import MODEL, start_gateway  # noqa: E402  (scripts/ is put on the path just above)
from gateway_clients import GatewayPath, TritonPath, gather_limited  # noqa: E402

IDS = [300, 301, 302, 303, 304, 305, 306, 307]


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
    import psutil

    body = {"model": MODEL, "prompt": IDS, "max_tokens": 4, "stream": True}
    engine = {
        "input_ids": np.array([IDS], np.int32),
        "input_lengths": np.array([[len(IDS)]], np.int32),
        "request_output_len": np.array([[4]], np.int32),
        "streaming": np.array([[True]]),
    }
    paths = {"direct": TritonPath(triton_url, "tensorrt_llm", engine)}
    paths.update({name: GatewayPath(gw.url, body) for name, gw in gws.items()})
    got: dict[str, list[float]] = {k: [] for k in paths}
    for i in range(rounds + 30):
        for name, path in list(paths.items())[:: 1 if i % 2 == 0 else -1]:
            t = await path.ttft()
            if i >= 30:
                got[name].append(t)
    for path in paths.values():
        await path.close()
    base = got["direct"]
    for name, xs in got.items():
        paired = statistics.median(x - b for x, b in zip(xs, base, strict=True)) * 1e3
        print(
            f"{name:7} TTFT p50 {statistics.median(xs) * 1e3:.3f} ms, added over direct (paired) {paired:.3f}"
        )
    diff = statistics.median(b - a for a, b in zip(got["A"], got["B"], strict=True)) * 1e3
    print(f"B - A, paired median: {diff:.3f} ms")
    stream = dict(body, max_tokens=128, stream_options={"include_usage": True})
    for level in levels:
        for name, gw in [*gws.items()] * 2:
            client, proc = GatewayPath(gw.url, stream), psutil.Process(gw.proc.pid)
            await gather_limited(client.stream_tokens, level, level)
            c0, t0 = proc.cpu_times(), time.perf_counter()
            n = sum(await gather_limited(client.stream_tokens, 2 * level, level))
            c1, wall = proc.cpu_times(), time.perf_counter() - t0
            await client.close()
            cpu = c1.user + c1.system - c0.user - c0.system
            print(f"{level} streams, {name}: {n / cpu:,.0f} tokens / gateway CPU-s, {n / wall:,.0f} / wall-s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (the reference)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--concurrency", default="64,256")
    args = ap.parse_args()

    from pipeline.bench.toy import write_toy_repo
    from pipeline.demo import write_checkpoint
    from pipeline.servers.tritonserver import TritonServer

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
            levels = [int(x) for x in args.concurrency.split(",") if x]
            asyncio.run(compare(srv.grpc_url, gws, args.rounds, levels))
        finally:
            for gw in gws.values():
                gw.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
