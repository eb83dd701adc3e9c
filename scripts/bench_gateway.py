"""Benchmark LPX's OpenAI gateway on real servers (tritonserver + the gateway process, loopback).

(a) TTFT the gateway adds over a direct gRPC stream to `tensorrt_llm` (same token ids), next to what the
    ensemble and BLS add, in one run on the demo's torch engine: sequential streamed requests of a few
    tokens, the four paths taken in turn each round so drift hits all alike; p50 and p90 of each path
    and their difference to the direct path. The same gateway-vs-direct comparison again over a toy
    `tensorrt_llm` that answers at once (pipeline/bench/toy.py with zero delays), where nothing but the
    transport is measured.
(b) The gateway's streaming ceiling over that toy: closed-loop streamed /v1/completions at each
    --concurrency level; streamed tokens (the usage each answer reports) per second of CPU the gateway
    process used (psutil), i.e. tokens per second per gateway CPU core, and per wall second. Beside it,
    the floor of any gRPC client on this machine: the same streams read straight from Triton by a bare
    grpc.aio loop (tokens per second of that client's CPU).

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

PROMPT = "Bread is made from flour, water and salt, and"
MODEL = "bench"


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q * 100))


# -- clients ---------------------------------------------------------------------------------------
def _has_output(resp) -> bool:
    """A response carrying tokens: output_ids (INT32, 4 bytes each) or text (BYTES: 4-byte length + text)."""
    for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=False):
        if (out.name == "output_ids" and len(raw) >= 4) or (out.name == "text_output" and len(raw) > 4):
            return True
    return False


class TritonPath:
    """One streamed request to a Triton model over grpc.aio; TTFT = first response carrying output."""

    def __init__(self, url: str, model: str, arrays: dict[str, np.ndarray]) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        from pipeline.bench.senders import _bytes_tensor

        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.enable_http_proxy", 0)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.req = service_pb2.ModelInferRequest(model_name=model)
        kinds = {"object": "BYTES", "int32": "INT32", "bool": "BOOL", "float32": "FP32"}
        for name, arr in arrays.items():
            kind = kinds[arr.dtype.name]
            self.req.inputs.add(name=name, datatype=kind, shape=list(arr.shape))
            self.req.raw_input_contents.append(_bytes_tensor(arr) if kind == "BYTES" else arr.tobytes())
        self.req.parameters["triton_enable_empty_final_response"].bool_param = True

    async def ttft(self) -> float:
        from grpc.aio import EOF

        t0 = time.perf_counter()
        first = None
        call = self.stub.ModelStreamInfer()
        await call.write(self.req)
        while (msg := await call.read()) is not EOF:
            if msg.error_message:
                raise RuntimeError(msg.error_message)
            resp = msg.infer_response
            if first is None and _has_output(resp):
                first = time.perf_counter() - t0
            if resp.parameters["triton_final_response"].bool_param:
                await call.done_writing()
                break
        if first is None:
            raise RuntimeError("no output")
        return first

    async def count_tokens(self) -> int:
        """A whole streamed answer read as it comes; its tokens (output_ids of every response)."""
        from grpc.aio import EOF

        tokens = 0
        call = self.stub.ModelStreamInfer()
        await call.write(self.req)
        while (msg := await call.read()) is not EOF:
            resp = msg.infer_response
            for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=False):
                if out.name == "output_ids":
                    tokens += len(raw) // 4
            if resp.parameters["triton_final_response"].bool_param:
                await call.done_writing()
                break
        return tokens

    async def close(self) -> None:
        await self.channel.close()


class GatewayPath:
    """One streamed /v1/completions; TTFT = the first SSE chunk (it carries text)."""

    def __init__(self, url: str, body: dict) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(trust_env=False, connector=aiohttp.TCPConnector(limit=0))
        self.url, self.body = f"{url}/v1/completions", json.dumps(body).encode()

    async def ttft(self) -> float:
        t0 = time.perf_counter()
        first = None
        async with self.session.post(
            self.url, data=self.body, headers={"Content-Type": "application/json"}
        ) as r:
            if r.status != 200:
                raise RuntimeError(await r.text())
            async for line in r.content:
                if line.startswith(b"data:") and first is None:
                    first = time.perf_counter() - t0
        assert first is not None
        return first

    async def stream_tokens(self) -> int:
        """A whole streamed answer; its tokens as usage reports them."""
        tokens = 0
        async with self.session.post(
            self.url, data=self.body, headers={"Content-Type": "application/json"}
        ) as r:
            if r.status != 200:
                raise RuntimeError(await r.text())
            async for line in r.content:
                if line.startswith(b"data: {") and b'"choices":[]' in line:  # the usage chunk
                    tokens = json.loads(line[5:])["usage"]["completion_tokens"]
        return tokens

    async def close(self) -> None:
        await self.session.close()


async def ttfts(paths: dict, rounds: int, warmup: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in paths}
    for i in range(warmup + rounds):
        for name, path in paths.items():
            t = await path.ttft()
            if i >= warmup:
                out[name].append(t)
    return out


def table(samples: dict[str, list[float]], base: str) -> dict:
    b50, b90 = pct(samples[base], 0.5), pct(samples[base], 0.9)
    rows = {}
    for name, xs in samples.items():
        p50, p90 = pct(xs, 0.5), pct(xs, 0.9)
        paired = [x - b for x, b in zip(xs, samples[base], strict=True)]  # same round, one after the other
        rows[name] = {
            "ttft_p50_ms": p50 * 1e3,
            "ttft_p90_ms": p90 * 1e3,
            "added_p50_ms": (p50 - b50) * 1e3,
            "added_p90_ms": (p90 - b90) * 1e3,
            "paired_added_median_ms": pct(paired, 0.5) * 1e3,
            "n": len(xs),
        }
    return rows


def show(title: str, rows: dict) -> None:
    print(f"\n{title}")
    print(
        f"{'path':<22}{'TTFT p50 ms':>12}{'p90 ms':>9}{'added p50':>11}{'added p90':>11}{'paired median':>15}"
    )
    for name, r in rows.items():
        print(
            f"{name:<22}{r['ttft_p50_ms']:>12.3f}{r['ttft_p90_ms']:>9.3f}{r['added_p50_ms']:>11.3f}"
            f"{r['added_p90_ms']:>11.3f}{r['paired_added_median_ms']:>15.3f}"
        )


async def gather_limited(fn, n: int, concurrency: int) -> list[int]:
    """`n` calls of `fn` with `concurrency` always in flight (closed loop); their results."""
    left, out = [n], []

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            out.append(await fn())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def bare_sse_app(scope: dict, receive, send) -> None:
    """The least an HTTP server can do for a streamed answer: read the body, send one event and [DONE]."""
    if scope["type"] != "http":
        return
    await receive()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.run(
        bare_sse_app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning"
    )


def http_floor(rounds: int, warmup: int) -> dict:
    """TTFT of a bare uvicorn SSE endpoint (same server stack and client as the gateway, no work): what
    HTTP alone costs on this machine."""
    import multiprocessing
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = multiprocessing.get_context("spawn").Process(target=_serve_bare, args=(port,), daemon=True)
    proc.start()
    try:

        async def run() -> list[float]:
            path = GatewayPath(f"http://127.0.0.1:{port}", {})
            try:
                for _ in range(100):
                    try:
                        await path.ttft()
                        break
                    except OSError:
                        await asyncio.sleep(0.1)
                return (await ttfts({"bare": path}, rounds, warmup))["bare"]
            finally:
                await path.close()

        xs = asyncio.run(run())
    finally:
        proc.terminate()
        proc.join(5)
    return {"ttft_p50_ms": pct(xs, 0.5) * 1e3, "ttft_p90_ms": pct(xs, 0.9) * 1e3, "n": len(xs)}


# -- servers ---------------------------------------------------------------------------------------
def start_gateway(triton_url: str, tokenizer: Path, work: Path, name: str):
    from pipeline.gateway.process import GatewayProcess
    from pipeline.gateway.settings import GatewaySettings

    settings = GatewaySettings(
        triton_url=triton_url,
        tokenizer=tokenizer,
        model_name=MODEL,
        port=0,
        keys_file=work / "no-keys.json",
        access_log=str(work / f"{name}-access.log"),
    )
    return GatewayProcess(settings, work / "run", work / f"{name}.log").start()


def part_a(work: Path, rounds: int, warmup: int, tokens: int) -> dict:
    from bench_repo import build_repo
    from transformers import AutoTokenizer

    from pipeline.stages.serve.tritonserver import TritonServer

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
    from pipeline.stages.serve.tritonserver import TritonServer

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
                "gateway": GatewayPath(
                    gw.url, {"model": MODEL, "prompt": ids, "max_tokens": 4, "stream": True}
                ),
            }
            try:
                out["ttft"] = table(await ttfts(paths, rounds, warmup), "direct tensorrt_llm")
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
            bare = TritonPath(srv.grpc_url, "tensorrt_llm", engine_inputs(tokens))
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
            for level in levels:
                out["throughput"].append(asyncio.run(level_part(level)))
        finally:
            gw.stop()
    print(
        f"\n(b) gateway streaming ceiling over the toy: {tokens}-token streamed completions, {per_level} x "
        "concurrency requests per level. bare gRPC: the same streams read straight from Triton by a grpc.aio "
        "loop in this process (tokens per second of its CPU): the floor of any gRPC client here"
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
