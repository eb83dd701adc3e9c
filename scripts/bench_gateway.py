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

Clients and helpers: pipeline/bench/gateway_clients.py; the run: pipeline/bench/gateway_bench.py.

Clients: grpc.aio raw stubs for Triton (as lpx bench does), aiohttp for the gateway (SSE), all in this
process; the gateway, Triton and this client share the machine's cores.

    python scripts/bench_gateway.py --out bench_gateway.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.gateway_bench import run
from pipeline.bench.script import run_script


def parser() -> argparse.ArgumentParser:
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
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
