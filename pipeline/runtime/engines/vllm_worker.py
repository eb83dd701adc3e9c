"""vLLM's AsyncLLM in a process of its own, run with vLLM's environment's python (not LPX's): the vllm
target's engine (vllm_engine.py) starts it and speaks JSON lines with it. It imports nothing of LPX, so
it runs where vLLM's transformers is not LPX's (docs/vllm.md says why the two cannot share a process).

    python vllm_worker.py <build folder> <fd>

In, on stdin (one JSON object a line; end of input shuts the engine down):
    {"op": "add", "id": "...", "ids": [prompt token ids], "params": {SamplingParams fields}}
        (params["structured_outputs"]: StructuredOutputsParams fields, e.g. {"grammar": EBNF})
    {"op": "abort", "id": "..."}
Out, on file descriptor <fd> (vLLM logs to stdout / stderr, which go to the server's log):
    {"ready": {"blocks": n, "block_size": n}}                   once the engine is up, or {"error": "..."}
    {"id": "...", "t": [new token ids], "d": finished, "lp": [their log probs] (when asked),
     "top": [[[k best ids], [their log probs]] per new token] (when asked for logprobs k > 0)}
    {"id": "...", "error": "..."}
    {"stats": {TensorRT-LLM IterationStats keys}}               at most every STATS_PERIOD_S
The build folder holds lpx_vllm.json (`model`: the checkpoint folder beside it, `engine_args`: vLLM's
EngineArgs by name; tests/contracts/vllm_engine_args.json holds the names vLLM 0.32.0 knows).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

MODEL_FILE = "lpx_vllm.json"  # the same name as vllm_engine.MODEL_FILE (this file imports nothing of LPX)
STATS_PERIOD_S = 0.05
TIMESTAMP_FORMAT = "%m-%d-%Y %H:%M:%S.%f"  # IterationStats.timestamp, as TensorRT-LLM's executor writes it
TRACE = os.environ.get("LPX_TRACE") or None  # pipeline/trace.py's folder: this file writes its `worker` lines


class Trace:
    """pipeline/trace.py's `worker` records (this file imports nothing of LPX): one line per delta."""

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"worker-{os.getpid()}.jsonl")
        self.out = open(path, "a", buffering=1, encoding="utf-8")

    def mark(self, rid: str, n: int, core: float | None, **more: float) -> None:
        record = {"id": rid, "n": n, "core": core, "t": time.monotonic(), **more}
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def got(self, rid: str) -> None:
        """The request's path: the worker took the request off its input (n 0: no token yet)."""
        self.mark(rid, 0, None)


class Channel:
    """The output file descriptor: one JSON object a line, written from the event loop's thread."""

    def __init__(self, fd: int) -> None:
        self.out = os.fdopen(fd, "w", buffering=1, encoding="utf-8")

    def send(self, message: dict) -> None:
        self.out.write(json.dumps(message, separators=(",", ":")) + "\n")


def stats_logger(channel: Channel, loop: asyncio.AbstractEventLoop, max_num_seqs: int):
    """A vLLM StatLoggerFactory whose logger sends the scheduler's state as IterationStats keys."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LpxStats(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            cache = vllm_config.cache_config
            self.blocks = int(cache.num_gpu_blocks or 0)
            self.block_size = int(cache.block_size or 0)
            self.steps, self.last, self.counts = 0, 0.0, (0, 0)

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            self.steps += 1
            if scheduler_stats is None:
                return
            now = time.monotonic()
            running, waiting = scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs
            # every STATS_PERIOD_S, and whenever the request counts change (the last state before the
            # engine goes idle is always sent: no stale "active" after a request ends or is aborted)
            if now - self.last < STATS_PERIOD_S and (running, waiting) == self.counts:
                return
            self.last, self.counts = now, (running, waiting)
            used = round(scheduler_stats.kv_cache_usage * self.blocks)
            prompt_tokens = getattr(iteration_stats, "num_prompt_tokens", 0) if iteration_stats else 0
            stats = {
                "timestamp": datetime.now().strftime(TIMESTAMP_FORMAT),
                "iter": self.steps,
                "numActiveRequests": running + waiting,
                "numQueuedRequests": waiting,
                "maxNumActiveRequests": max_num_seqs,
                "kvCacheStats": {
                    "maxNumBlocks": self.blocks,
                    "freeNumBlocks": self.blocks - used,
                    "usedNumBlocks": used,
                    "tokensPerBlock": self.block_size,
                },
                "inflightBatchingStats": {
                    "numScheduledRequests": running,
                    "numCtxTokens": int(prompt_tokens),
                },
            }
            loop.call_soon_threadsafe(channel.send, {"stats": stats})

        def log_engine_initialized(self) -> None:
            return None

    return LpxStats


LINE_LIMIT = 1 << 28  # bytes of one request line at most (a prompt's token ids as JSON: ~7 bytes a token)


async def messages():
    """The requests on stdin, read by the event loop itself (no thread hand-off before vLLM sees one)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip():
            yield json.loads(line)


def best(entry: dict, k: int) -> list[list]:
    """The k best of one position's {token id: Logprob}, best first: [[ids], [log probs]]."""
    ranked = sorted(entry.items(), key=lambda item: item[1].rank)[:k]
    return [[int(token) for token, _ in ranked], [float(lp.logprob) for _, lp in ranked]]


async def generate(engine, channel: Channel, message: dict, trace: Trace | None = None) -> None:
    """One request: its token deltas to the channel, the last one with d=true."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    rid = message["id"]
    fields = dict(message["params"])
    if fields.get("structured_outputs"):
        fields["structured_outputs"] = StructuredOutputsParams(**fields["structured_outputs"])
    try:
        params = SamplingParams(**fields, detokenize=False, output_kind=RequestOutputKind.DELTA)
        k = params.logprobs or 0
        made = 0
        async for out in engine.generate({"prompt_token_ids": message["ids"]}, params, rid):
            piece = out.outputs[0]
            reply = {"id": rid, "t": list(piece.token_ids), "d": bool(out.finished)}
            if params.logprobs is not None:
                entries = list(zip(piece.token_ids, piece.logprobs or [], strict=False))
                reply["lp"] = [float(entry[token].logprob) for token, entry in entries]
                if k:  # each entry holds the k best (rank 1..k) and the sampled token, whatever its rank
                    reply["top"] = [best(entry, k) for _, entry in entries]
            if trace is not None:  # the engine core's time of the delta, then ours, just before sending
                metrics = getattr(out, "metrics", None)
                # with the first delta, when the engine core queued and first scheduled the request
                first = {} if made else {k: getattr(metrics, k, None) for k in ("queued_ts", "scheduled_ts")}
                made += len(piece.token_ids)
                trace.mark(rid, made, getattr(metrics, "last_token_ts", None), **first)
            channel.send(reply)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the request failed; the engine goes on
        channel.send({"id": rid, "error": f"{type(exc).__name__}: {exc}"})


async def serve(folder: Path, channel: Channel) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    meta = json.loads((folder / MODEL_FILE).read_text(encoding="utf-8"))
    cpu = current_platform.is_cpu()
    if cpu and meta.get("format") not in (None, "none"):
        raise RuntimeError(
            f"format {meta['format']} needs a GPU: vLLM on CPU has no FP8 / NVFP4 kernels - serve the "
            "variant with quantization.format none on CPU, or serve this one on a GPU"
        )
    # the KV-cache size: bytes on CPU (build.max_batch_size full sequences), a memory share on a GPU
    args = {**meta["engine_args"], **(meta.get("cpu_engine_args" if cpu else "gpu_engine_args") or {})}
    loop = asyncio.get_running_loop()
    factory = stats_logger(channel, loop, int(args.get("max_num_seqs") or 0))
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=str(folder / meta["model"]), **args),
        stat_loggers=[factory],
    )
    cache = engine.vllm_config.cache_config
    channel.send({"ready": {"blocks": int(cache.num_gpu_blocks or 0), "block_size": int(cache.block_size)}})
    tasks: dict[str, asyncio.Task] = {}
    trace = Trace(TRACE) if TRACE else None
    try:
        async for message in messages():  # until end of input
            if message["op"] == "add":
                if trace is not None:
                    trace.got(message["id"])
                task = loop.create_task(generate(engine, channel, message, trace))
                tasks[message["id"]] = task
                task.add_done_callback(lambda _t, rid=message["id"]: tasks.pop(rid, None))
            elif message["op"] == "abort" and message["id"] in tasks:
                tasks[message["id"]].cancel()  # generate()'s cancellation aborts the request in vLLM
    finally:
        for task in list(tasks.values()):
            task.cancel()
        engine.shutdown()


def main(argv: list[str]) -> int:
    folder, fd = Path(argv[0]), int(argv[1])
    channel = Channel(fd)
    nice = os.environ.get("LPX_VLLM_NICE") or "0"
    if not nice.isdigit() or int(nice) > 19:
        channel.send({"error": f"LPX_VLLM_NICE={nice}: give a niceness from 0 to 19 (or unset it)"})
        return 1
    if int(nice):  # vLLM's processes (this one, its engine core, its model worker) yield to LPX's hops
        os.nice(int(nice))
    try:
        asyncio.run(serve(folder, channel))
    except Exception as exc:
        channel.send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
