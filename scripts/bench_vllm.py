"""LPX's vllm target through its gateway against vLLM's own OpenAI server on the same build folder, and
against LPX's torch target, on this machine, in one run (issue 26 item 5; docs/vllm.md has the figures).

The three servers run side by side (one at a time would put minutes of machine drift between them); the
measurement alternates: each round runs `lpx bench --api openai --endpoint completions` on each server in
turn, the order reversed every other round, and the table takes each level's median over rounds of TTFT
p50 / p99, ITL p50, output tok/s and req/s. vLLM's own server gets the build's engine arguments and the
same tcmalloc / Intel OpenMP preloads as LPX's worker.

    make setup vllm
    .venv/bin/python scripts/bench_vllm.py --out docs/results/vllm-cpu --rounds 3

With `--aiperf PATH` (NVIDIA's AIPerf, `pip install aiperf==0.13.0` in a venv of its own: its
dependencies are not LPX's), each round also runs `aiperf profile` at each level on each server, the same
input / output lengths (output forced with `--extra-inputs ignore_eos:true`, counted by the server), and
the table gets an AIPerf block beside `lpx bench`'s.

`--checkpoint DIR` measures another Hugging Face checkpoint instead of the demo's tiny model (the
real-model example's, say). `--trace` starts LPX's servers with LPX_TRACE (pipeline/trace.py) and, after
the rounds, sends streamed completions at each level and prints where the median token spent its time in
each hop (engine core -> vLLM worker -> the stub's reader -> the request's thread -> Triton's sender ->
the gateway -> the client), then each request's own path to its first token (the gateway's gRPC call,
the stub's execute(), vLLM's worker, its engine core's queue and prefill, the first token's hops) in
means, which add up to the TTFT; with vllm-own among the servers, the same requests to vLLM's own server
beside it, split by its /metrics histograms (its front end's TTFT, queue and prefill).
`--trace-requests N` sets the streamed requests a level (default 2 x c, 4 at least); `--no-bench` skips
the rounds, `--servers` picks the servers. `--pin 1`
binds LPX's own hops (gateway, tritonserver, its python stubs) to CPU 1 once the servers are up, off the
core vLLM binds its compute threads to (VLLM_CPU_OMP_THREADS_BIND=auto: core 0 of 2), to see what the
machine's sharing costs LPX's path.

    .venv/bin/python scripts/bench_vllm.py --out /tmp/trace --trace --no-bench --servers lpx-vllm
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.script import run_script
from pipeline.bench.trace_join import HOPS, PATH, request_path, timeline, trace_table  # noqa: F401 (tests read them here)
from pipeline.bench.vllm_compare import run


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--aiperf", help="AIPerf's executable: also measure every server with it")
    ap.add_argument(
        "--checkpoint", type=Path, help="a Hugging Face checkpoint (default: the demo's tiny one)"
    )
    ap.add_argument("--trace", action="store_true", help="the per-hop timeline of LPX's servers (LPX_TRACE)")
    ap.add_argument(
        "--trace-requests",
        type=int,
        default=0,
        help="streamed requests a level for --trace (default 2 x c, 4 at least)",
    )
    ap.add_argument(
        "--no-bench", action="store_true", help="skip the rounds (with --trace: the timeline only)"
    )
    ap.add_argument("--servers", default="lpx-vllm,lpx-torch,vllm-own", help="which servers to start")
    ap.add_argument(
        "--pin",
        help="CPUs (e.g. 1 or 1-3) to bind LPX's own hops to once the servers are up: the gateway, "
        "tritonserver and its stubs, not vLLM's processes (vLLM binds its compute threads itself)",
    )
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
