"""An opt-in per-token timeline through the serving hops: where a token waits between the engine and the
client (docs/vllm.md, "Where a token waits").

Off unless `LPX_TRACE=<folder>` is set in the environment of `lpx serve` (Triton, its python stubs, the
gateway and vLLM's worker inherit it). Off, a hop pays one module-level boolean test. On, each hop appends
one JSON line per token delta to `<folder>/<hop>-<pid>.jsonl`: `t`, a CLOCK_MONOTONIC reading (one clock
for every process of the machine, so hops of different processes subtract), the request's id at that hop
and `n`, the tokens generated so far (the join key across hops):

    worker    vLLM's worker (vllm_worker.py, which imports nothing of LPX and writes the same lines):
              `core`, when vLLM's engine core emitted the delta (RequestOutput.metrics.last_token_ts,
              engine-core monotonic time), and `t`, just before the worker wrote it to the stub; the
              first delta also has `queued_ts` / `scheduled_ts` (when the engine core queued and first
              scheduled the request), and a record with `n` 0 says when the worker read the request
    reader    VllmEngine's reader thread: the worker's line read
    taken     the request's thread took the delta off the engine's queue (DeltaStream)
    stub      just before Triton's response sender (`tid`, Triton's request id, beside the engine's `id`)
    gateway   the gateway's gRPC stream: the Triton response read (`id`: Triton's request id)
    request   the request's own path, once per request (`at`): `gateway` (handed to Triton, `tid`),
              `stub` (the Triton model's execute() has it, `tid`) and `submit` (handing it to the
              engine begins: in its own thread, or in execute() for a QUICK_START engine); the
              engine's id for the join is the one on the `stub` hop's records

scripts/bench_vllm.py --trace sends streamed requests, adds the client's receipt of each chunk and prints
the median time a token spent in each hop at each concurrency.
"""

from __future__ import annotations

import json
import os
import threading
import time

VARIABLE = "LPX_TRACE"
FOLDER = os.environ.get(VARIABLE) or None
ON = FOLDER is not None

_files: dict[str, object] = {}
_lock = threading.Lock()


def mark(hop: str, **fields) -> None:
    """One record in this process's file for `hop` (`t` is now unless given). Call only when ON."""
    fields.setdefault("t", time.monotonic())
    line = json.dumps(fields, separators=(",", ":")) + "\n"
    with _lock:
        out = _files.get(hop)
        if out is None:
            os.makedirs(FOLDER, exist_ok=True)
            path = os.path.join(FOLDER, f"{hop}-{os.getpid()}.jsonl")
            out = _files[hop] = open(path, "a", buffering=1, encoding="utf-8")
        out.write(line)


def read(folder: str | os.PathLike) -> dict[str, list[dict]]:
    """Every record under `folder`, by hop."""
    out: dict[str, list[dict]] = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        hop = name.rsplit("-", 1)[0]
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):  # a line being written as we read is left out
                    out.setdefault(hop, []).append(json.loads(line))
    return out
