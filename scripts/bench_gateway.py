"""Benchmark LPX's OpenAI gateway on real servers (tritonserver + the gateway process, loopback).

(a) TTFT the gateway adds over a direct gRPC stream to `tensorrt_llm` (same token ids), next to what the
    ensemble and BLS add, in one run on the demo's torch engine: sequential streamed requests of a few
    tokens, the four paths taken in turn each round so drift hits all alike; p50 and p90 of each path
    and their difference to the direct path. The same gateway-vs-direct comparison again over a toy
    `tensorrt_llm` that answers at once (pipeline/bench/toy.py with zero delays), where nothing but the
    transport is measured; there also against the one-message server-streaming call the gateway itself
    makes (what is left is the gateway's own cost, HTTP included).
(b) The gateway's streaming ceiling over that toy: closed-loop streamed /v1/completions at each
    --concurrency level; streamed tokens (the usage each answer reports) per second of CPU the gateway
    process used (psutil), i.e. tokens per second per gateway CPU core, and per wall second. Beside it,
    the floor of any gRPC client on this machine: the same streams read straight from Triton by a bare
    grpc.aio loop making the gateway's call (tokens per second of that client's CPU).

Clients and helpers: scripts/gateway_clients.py.

Clients: grpc.aio raw stubs for Triton (as lpx bench does), aiohttp for the gateway (SSE), all in this
process; the gateway, Triton and this client share the machine's cores.

    python scripts/bench_gateway.py --out bench_gateway.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from gateway_clients import (  # noqa: E402  (scripts/ is put on the path just above)
    GatewayPath,
    TritonPath,
    gather_limited,
    http_floor,
    show,
    table,
    ttfts,
)

PROMPT = "Bread is made from flour, water and salt, and"
MODEL = "bench"


# -- servers ---------------------------------------------------------------------------------------
def start_gateway(triton_url: str, tokenizer: Path, work: Path, name: str):
    from pipeline.gateway.process import GatewayProcess
    from pipeline.gateway.settings import GatewaySettings

    settings = GatewaySettings(
        triton_url=triton_url,
        tokenizer=tokenizer,
        model_name=MODEL,
        port=0,
        api_keys_file=work / "no-keys.json",
        access_log=str(work / f"{name}-access.log"),
    )
    return GatewayProcess(settings, work / "run", work / f"{name}.log").start()


def part_a(work: Path, rounds: int, warmup: int, tokens: int) -> dict:
    from bench_repo import build_repo
    from transformers import AutoTokenizer

    from pipeline.servers.tritonserver import TritonServer

    repo, engine = work / "repo", work / "engine"
    if not (repo / "tensorrt_llm").is_dir():  # a --work folder of an earlier run keeps its repository
        repo, engine = build_repo(work, "fp8")
    tok = AutoTokenizer.from_pretrained(engine)
    ids = tok(PROMPT)["input_ids"]
    with TritonServer(repo, log_path=work / "triton.log", ready_timeout_s=300) as srv:
        gw = start_gateway(srv.grpc_url, repo / "preprocessing" / "1" / "tokenizer", work, "gateway")
        try:

            async def run() -> dict:
                text = {
                    "text_input": np.array([[PROMPT.encode()]], dtype=object),
                    "max_tokens": np.array([[tokens]], np.int32),
                    "stream": np.array([[True]]),
                }
                paths = {
                    "direct tensorrt_llm": TritonPath(
                        srv.grpc_url,
                        "tensorrt_llm",
                        {
                            "input_ids": np.array([ids], np.int32),
                            "input_lengths": np.array([[len(ids)]], np.int32),
                            "request_output_len": np.array([[tokens]], np.int32),
                            "streaming": np.array([[True]]),
                        },
                    ),
                    "gateway": GatewayPath(
                        gw.url,
                        {
                            "model": MODEL,
                            "prompt": PROMPT,
                            "max_tokens": tokens,
                            "temperature": 0,
                            "stream": True,
                        },
                    ),
                    "ensemble": TritonPath(srv.grpc_url, "ensemble", text),
                    "tensorrt_llm_bls": TritonPath(srv.grpc_url, "tensorrt_llm_bls", text),
                }
                try:
                    return table(await ttfts(paths, rounds, warmup), "direct tensorrt_llm")
                finally:
                    for p in paths.values():
                        await p.close()

            rows = asyncio.run(run())
        finally:
            gw.stop()
    show(
        f"(a) torch engine (demo model, fp8, CPU): TTFT of {rounds} sequential requests per path, {tokens} tokens each",
        rows,
    )
    return rows


def part_b(work: Path, rounds: int, warmup: int, levels: list[int], tokens: int, per_level: int) -> dict:
    import psutil

    from pipeline.bench.toy import write_toy_repo
    from pipeline.demo import write_checkpoint
    from pipeline.servers.tritonserver import TritonServer

    ckpt = work / "checkpoint"
    if not (ckpt / "tokenizer.json").is_file():
        write_checkpoint(ckpt)
    repo = write_toy_repo(work / "toy-repo", 0, 0, first_id=300, id_span=200)  # decodable demo-vocabulary ids
    ids = [300, 301, 302, 303, 304, 305, 306, 307]

    def engine_inputs(n: int) -> dict[str, np.ndarray]:
        return {
            "input_ids": np.array([ids], np.int32),
            "input_lengths": np.array([[len(ids)]], np.int32),
            "request_output_len": np.array([[n]], np.int32),
            "streaming": np.array([[True]]),
        }

    out: dict = {"ttft": {}, "throughput": []}
    with TritonServer(repo, log_path=work / "toy-triton.log", ready_timeout_s=120) as srv:
        gw = start_gateway(srv.grpc_url, ckpt, work, "toy-gateway")
        proc = psutil.Process(gw.proc.pid)

        async def ttft_part() -> None:
            paths = {
                "direct tensorrt_llm": TritonPath(srv.grpc_url, "tensorrt_llm", engine_inputs(4)),
                "direct, one-message call": TritonPath(
                    srv.grpc_url, "tensorrt_llm", engine_inputs(4), unary=True
                ),
                "gateway": GatewayPath(
                    gw.url, {"model": MODEL, "prompt": ids, "max_tokens": 4, "stream": True}
                ),
            }
            try:
                samples = await ttfts(paths, rounds, warmup)
                out["ttft"] = table(samples, "direct tensorrt_llm")
                # the gateway over the very call it makes itself: its own cost, HTTP included
                out["ttft_over_one_message_call"] = table(samples, "direct, one-message call")["gateway"]
            finally:
                for p in paths.values():
                    await p.close()

        async def level_part(level: int) -> dict:
            n = per_level * level
            body = {
                "model": MODEL,
                "prompt": ids,
                "max_tokens": tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            client = GatewayPath(gw.url, body)
            bare = TritonPath(srv.grpc_url, "tensorrt_llm", engine_inputs(tokens), unary=True)
            try:
                await gather_limited(client.stream_tokens, level, level)  # warm-up, not counted
                cpu0, t0 = proc.cpu_times(), time.perf_counter()
                counted = sum(await gather_limited(client.stream_tokens, n, level))
                wall, cpu1 = time.perf_counter() - t0, proc.cpu_times()
                mine0, b0 = time.process_time(), time.perf_counter()
                bare_counted = sum(await gather_limited(bare.count_tokens, n, level))
                bare_cpu, bare_wall = time.process_time() - mine0, time.perf_counter() - b0
            finally:
                await client.close()
                await bare.close()
            cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
            return {
                "concurrency": level,
                "requests": n,
                "tokens": counted,
                "wall_s": wall,
                "gateway_cpu_s": cpu,
                "tokens_per_gateway_cpu_s": counted / cpu,
                "tokens_per_wall_s": counted / wall,
                "gateway_cores_busy": cpu / wall,
                "bare_grpc_tokens": bare_counted,
                "bare_grpc_client_cpu_s": bare_cpu,
                "tokens_per_bare_grpc_cpu_s": bare_counted / bare_cpu,
                "bare_grpc_tokens_per_wall_s": bare_counted / bare_wall,
            }

        try:
            asyncio.run(ttft_part())
            show(
                f"(a') toy tensorrt_llm (answers at once): TTFT of {rounds} sequential requests per path, 4 tokens",
                out["ttft"],
            )
            over = out["ttft_over_one_message_call"]
            print(
                f"gateway over the one-message call it makes: added p50 {over['added_p50_ms']:.3f} ms, "
                f"paired median {over['paired_added_median_ms']:.3f} ms"
            )
            for level in levels:
                out["throughput"].append(asyncio.run(level_part(level)))
        finally:
            gw.stop()
    print(
        f"\n(b) gateway streaming ceiling over the toy: {tokens}-token streamed completions, {per_level} x "
        "concurrency requests per level. bare gRPC: the same streams read straight from Triton by a grpc.aio "
        "loop in this process making the gateway's call (tokens per second of its CPU): the floor of any gRPC "
        "client here"
    )
    print(
        f"{'concurrency':>11}{'requests':>10}{'tokens':>9}{'tok/gw-CPU-s':>14}{'tok/wall-s':>12}"
        f"{'gw cores':>10}{'bare gRPC tok/CPU-s':>21}"
    )
    for r in out["throughput"]:
        print(
            f"{r['concurrency']:>11}{r['requests']:>10}{r['tokens']:>9}{r['tokens_per_gateway_cpu_s']:>14.0f}"
            f"{r['tokens_per_wall_s']:>12.0f}{r['gateway_cores_busy']:>10.2f}"
            f"{r['tokens_per_bare_grpc_cpu_s']:>21.0f}"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="sequential requests per path in (a)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=4, help="output tokens per request in (a)")
    ap.add_argument("--concurrency", default="64,256", help="levels of (b)")
    ap.add_argument("--stream-tokens", type=int, default=128, help="tokens per streamed answer in (b)")
    ap.add_argument("--per-level", type=int, default=2, help="(b): requests per level = this x concurrency")
    ap.add_argument("--skip-torch", action="store_true", help="only the toy parts (no engine build)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the servers' files (default: temp)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="lpx-bench-gateway-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LPX_HOME", str(work / "home"))
    report: dict = {"cpu_count": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()}}
    if not args.skip_torch:
        report["torch"] = part_a(work, args.rounds, args.warmup, args.tokens)
    floor = report["http_floor"] = http_floor(args.rounds, args.warmup)
    print(
        f"\nreference: a bare uvicorn SSE endpoint (no work) answers its first event in {floor['ttft_p50_ms']:.3f} ms "
        f"p50, {floor['ttft_p90_ms']:.3f} ms p90 to the same client"
    )
    levels = [int(x) for x in args.concurrency.split(",") if x]
    report["toy"] = part_b(work, args.rounds, args.warmup, levels, args.stream_tokens, args.per_level)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
