"""scripts/bench_gateway.py's measurements of LPX's OpenAI gateway on real servers (tritonserver and the
gateway process, loopback): (a) the TTFT it adds over a direct gRPC stream to `tensorrt_llm`, beside the
ensemble's and BLS's, on the demo's torch engine and over a toy `tensorrt_llm` that answers at once; (b) its
streaming ceiling over that toy, in tokens per second of its CPU, beside a bare grpc.aio client's (the
script's docstring says how).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from .gateway_clients import GatewayPath, TritonPath, gather_limited, http_floor, show, table, ttfts
from .options import parse_levels

PROMPT = "Bread is made from flour, water and salt, and"
MODEL = "bench"
TOY_IDS = [300, 301, 302, 303, 304, 305, 306, 307]  # decodable ids of the demo's vocabulary


# -- servers ---------------------------------------------------------------------------------------
def start_gateway(triton_url: str, tokenizer: Path, work: Path, name: str):
    from ..gateway.process import GatewayProcess
    from ..gateway.settings import GatewaySettings

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
    from transformers import AutoTokenizer

    from ..servers.tritonserver import TritonServer
    from .repo_bench import build_repo

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


def toy_engine_inputs(n: int) -> dict[str, np.ndarray]:
    """The direct `tensorrt_llm` request of TOY_IDS, `n` tokens, streamed."""
    return {
        "input_ids": np.array([TOY_IDS], np.int32),
        "input_lengths": np.array([[len(TOY_IDS)]], np.int32),
        "request_output_len": np.array([[n]], np.int32),
        "streaming": np.array([[True]]),
    }


def part_b(work: Path, rounds: int, warmup: int, levels: list[int], tokens: int, per_level: int) -> dict:
    """(a') and (b) over the toy `tensorrt_llm` (answers at once): TTFT per path, then each level's ceiling."""
    import psutil

    from ..demo import write_checkpoint
    from ..servers.tritonserver import TritonServer
    from .toy import write_toy_repo

    ckpt = work / "checkpoint"
    if not (ckpt / "tokenizer.json").is_file():
        write_checkpoint(ckpt)
    repo = write_toy_repo(work / "toy-repo", 0, 0, first_id=300, id_span=200)  # decodable demo-vocabulary ids
    out: dict = {"ttft": {}, "throughput": []}
    with TritonServer(repo, log_path=work / "toy-triton.log", ready_timeout_s=120) as srv:
        gw = start_gateway(srv.grpc_url, ckpt, work, "toy-gateway")
        proc = psutil.Process(gw.proc.pid)
        try:
            out.update(asyncio.run(toy_ttft(srv.grpc_url, gw.url, rounds, warmup)))
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
                out["throughput"].append(
                    asyncio.run(level_part(srv.grpc_url, gw.url, proc, level, tokens, per_level * level))
                )
        finally:
            gw.stop()
    print_throughput(out["throughput"], tokens, per_level)
    return out


async def toy_ttft(grpc_url: str, gateway_url: str, rounds: int, warmup: int) -> dict:
    """TTFT over the toy: the direct stream, the one-message call the gateway makes, and the gateway."""
    paths = {
        "direct tensorrt_llm": TritonPath(grpc_url, "tensorrt_llm", toy_engine_inputs(4)),
        "direct, one-message call": TritonPath(grpc_url, "tensorrt_llm", toy_engine_inputs(4), unary=True),
        "gateway": GatewayPath(
            gateway_url, {"model": MODEL, "prompt": TOY_IDS, "max_tokens": 4, "stream": True}
        ),
    }
    try:
        samples = await ttfts(paths, rounds, warmup)
        return {
            "ttft": table(samples, "direct tensorrt_llm"),
            # the gateway over the very call it makes itself: its own cost, HTTP included
            "ttft_over_one_message_call": table(samples, "direct, one-message call")["gateway"],
        }
    finally:
        for p in paths.values():
            await p.close()


async def level_part(grpc_url: str, gateway_url: str, proc, level: int, tokens: int, n: int) -> dict:
    """`n` streamed `tokens`-token completions through the gateway, `level` at a time (after a warm-up
    round), the gateway process's (`proc`) CPU meanwhile; then the same streams by a bare gRPC client."""
    body = {
        "model": MODEL,
        "prompt": TOY_IDS,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    client = GatewayPath(gateway_url, body)
    bare = TritonPath(grpc_url, "tensorrt_llm", toy_engine_inputs(tokens), unary=True)
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
    return throughput_row(level, n, (counted, wall, cpu), (bare_counted, bare_wall, bare_cpu))


def throughput_row(level: int, n: int, gateway: tuple, bare: tuple) -> dict:
    """One level's figures from (tokens, wall s, CPU s) of the gateway process and of the bare client."""
    (counted, wall, cpu), (bare_counted, bare_wall, bare_cpu) = gateway, bare
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


def print_throughput(rows: list[dict], tokens: int, per_level: int) -> None:
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
    for r in rows:
        print(
            f"{r['concurrency']:>11}{r['requests']:>10}{r['tokens']:>9}{r['tokens_per_gateway_cpu_s']:>14.0f}"
            f"{r['tokens_per_wall_s']:>12.0f}{r['gateway_cores_busy']:>10.2f}"
            f"{r['tokens_per_bare_grpc_cpu_s']:>21.0f}"
        )


def run(args: argparse.Namespace) -> int:
    """(a) unless --skip-torch, the HTTP floor, (a') and (b); the figures to --out."""
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
    levels = parse_levels(args.concurrency)
    report["toy"] = part_b(work, args.rounds, args.warmup, levels, args.stream_tokens, args.per_level)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0
