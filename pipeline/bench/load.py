"""Drive a served model with streamed requests: closed loop (fixed concurrency) or open loop (rate).

One asyncio loop, no threads; the senders are senders.py (and openai_load.py). gRPC talks to Triton's `ModelStreamInfer` on a `grpc.aio` channel with
one short bidirectional stream per request (errors belong to their request); HTTP posts to
`generate_stream` with aiohttp. Open-loop latency counts from each request's SCHEDULED time, so a
client or server that falls behind shows up in TTFT/E2E (no coordinated omission). Failed requests
are recorded with their error, never dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import LpxError

ENGINE = "tensorrt_llm"
log = logging.getLogger("lpx.bench")


@dataclass
class LoadSpec:
    """What each request asks: `tensorrt_llm` gets token ids, any other model (the ensemble) text."""

    url: str
    model: str = "ensemble"
    protocol: str = "grpc"
    input_len: int = 128
    output_len: int = 128
    input_len_std: float = 0.0  # > 0: lengths drawn per request from a normal distribution (rounded, >= 1)
    output_len_std: float = 0.0
    vocab: tuple[int, int] = (100, 30000)  # random prompt ids are drawn from [lo, hi)
    prompts: tuple[
        str, ...
    ] = ()  # a dataset's prompts (text models): drawn at random instead of synthetic text
    prompt_ids: tuple[np.ndarray, ...] = field(  # a dataset's prompts as token ids (tensorrt_llm): drawn
        default=(),
        repr=False,
        compare=False,  # at random instead of synthetic ids
    )
    on_done: Callable[[Record], None] | None = field(default=None, repr=False, compare=False)  # progress hook
    count_tokens: bool = False  # text models: ask for num_output_tokens (set when the model declares it)
    count_input: bool = (
        False  # ask for num_input_tokens (set when the model declares return_num_input_tokens)
    )
    force_output: bool = False  # send min_tokens = max_tokens (set when the model declares and honours it)
    maker: Any = field(default=None, repr=False, compare=False)  # prompts.PromptMaker: exact-length text
    seed: int = 0
    timeout_s: float = 600.0
    endpoint: str = "chat"  # protocol "openai": "chat" or "completions" (openai_load.py)
    api_key: str | None = field(default=None, repr=False)


@dataclass
class Record:
    """One request's timeline (time.perf_counter seconds) and the tokens the server said it sent."""

    start: float  # scheduled time (open loop) or send time (closed loop): latency counts from here
    sent: float = 0.0
    times: list[float] = field(default_factory=list)  # arrival of each response that carried output
    tokens: list[int] = field(default_factory=list)  # output tokens in each of those responses
    end: float = 0.0
    error: str | None = None
    sent_ns: int = 0  # time.time_ns() at send: the wall clock a server's emit stamps share on one machine
    emits_ns: list[int] = field(
        default_factory=list
    )  # server-side emit time of each of those responses, if sent
    isl: int = 0  # input tokens asked for (0: a dataset prompt, no length asked)
    osl: int = 0  # output tokens asked for (max_tokens / request_output_len)
    input_tokens: int | None = None  # input tokens measured: the server's num_input_tokens, else counted
    input_counted_by: str | None = None  # "num_input_tokens" | "tokenizer" | "input_ids" | "usage"


@dataclass
class Run:
    """One load level: its records (warm-up excluded), wall time, and the client's own CPU use."""

    records: list[Record]
    wall_s: float
    cpu_s: float
    token_source: str  # "output_ids" | "num_output_tokens" | "responses" (text, no count: one per response)
    load: dict[str, Any]


def draw_len(mean: int, std: float, rng: np.random.Generator) -> int:
    """`mean` when std is 0, else a normal draw rounded and kept >= 1."""
    return mean if std <= 0 else max(1, int(round(rng.normal(mean, std))))


def prompt_ids(spec: LoadSpec, rng: np.random.Generator, length: int | None = None) -> np.ndarray:
    """A synthetic prompt of exactly `length` (default `input_len`) token ids."""
    n = spec.input_len if length is None else length
    return rng.integers(spec.vocab[0], spec.vocab[1], size=n, dtype=np.int32)


def prompt_text(spec: LoadSpec, rng: np.random.Generator, length: int | None = None) -> str:
    """A dataset prompt when the spec has some, else a prompt of exactly `length` tokens as the served
    model counts them (spec.maker, the served model's tokenizer), else `length` common English words
    (no tokenizer: about `length` tokens)."""
    from .prompts import common_words

    if spec.prompts:
        return spec.prompts[int(rng.integers(len(spec.prompts)))]
    n = spec.input_len if length is None else length
    return spec.maker.make(n, rng) if spec.maker is not None else common_words(n, rng)


Tensors = dict[str, tuple[str, np.ndarray]]


def _tensors(spec: LoadSpec, rng: np.random.Generator) -> tuple[Tensors, Record]:
    """Request tensors, batch of one, as the tensor table types them, and the request's record (start 0)
    with the lengths asked for and the input tokens counted client-side where known."""
    isl = draw_len(spec.input_len, spec.input_len_std, rng)
    osl = draw_len(spec.output_len, spec.output_len_std, rng)
    rec = Record(start=0.0, osl=osl)
    flags: Tensors = {}
    if spec.force_output:
        flags["min_tokens"] = ("INT32", np.array([[osl]], np.int32))
    if spec.count_input:
        flags["return_num_input_tokens"] = ("BOOL", np.array([[True]]))
    if spec.model == ENGINE:
        if spec.prompt_ids:
            ids, isl = spec.prompt_ids[int(rng.integers(len(spec.prompt_ids)))], 0
        else:
            ids = prompt_ids(spec, rng, isl)
        rec.isl, rec.input_tokens, rec.input_counted_by = isl, int(ids.size), "input_ids"
        return {
            "input_ids": ("INT32", ids[None, :]),
            "input_lengths": ("INT32", np.array([[ids.size]], np.int32)),
            "request_output_len": ("INT32", np.array([[osl]], np.int32)),
            "streaming": ("BOOL", np.array([[True]])),
            **flags,
        }, rec
    text = prompt_text(spec, rng, isl)
    rec.isl = 0 if spec.prompts else isl
    if spec.maker is not None:
        rec.input_tokens, rec.input_counted_by = spec.maker.count(text), "tokenizer"
    tensors = {
        "text_input": ("BYTES", np.array([[text.encode()]], dtype=object)),
        "max_tokens": ("INT32", np.array([[osl]], np.int32)),
        "stream": ("BOOL", np.array([[True]])),
        **flags,
    }
    if spec.count_tokens:
        tensors["return_num_output_tokens"] = ("BOOL", np.array([[True]]))
    return tensors, rec


COUNT_INPUT = "return_num_output_tokens"
COUNT_PROMPT = "return_num_input_tokens"
FORCE_OUTPUT = "min_tokens"


def model_inputs(spec: LoadSpec) -> set[str] | None:
    """The input names `spec.model` declares (Triton's model metadata), or None if the server cannot say."""
    from tritonclient.utils import InferenceServerException

    try:
        if spec.protocol == "grpc":
            import tritonclient.grpc as client

            meta = client.InferenceServerClient(spec.url).get_model_metadata(spec.model, as_json=True)
        else:
            import tritonclient.http as client

            url = spec.url.split("://", 1)[-1]
            meta = client.InferenceServerClient(url).get_model_metadata(spec.model)
    except (InferenceServerException, OSError) as exc:
        log.warning(
            "cannot read %s's inputs at %s (%s): min_tokens and token counts are not asked for",
            spec.model,
            spec.url,
            str(exc)[:200],
        )
        return None
    return {t["name"] for t in meta.get("inputs", [])}


def arrival_offsets(rate: float, n: int, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times (s from start) of n requests at `rate`/s: gamma gaps with shape `burstiness` and mean
    1/rate (shape 1 = Poisson, exponential gaps; < 1 burstier, > 1 more regular). First at 0."""
    if rate <= 0 or burstiness <= 0:
        raise LpxError("--rate and --burstiness must be positive")
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else gaps


# -- one request -----------------------------------------------------------------------------------
def _sender(spec: LoadSpec) -> Any:
    from .senders import GrpcSender, HttpSender

    if spec.protocol == "grpc":
        return GrpcSender(spec)
    if spec.protocol == "http":
        return HttpSender(spec)
    if spec.protocol == "openai":
        from .openai_load import OpenAISender

        return OpenAISender(spec)
    raise LpxError(f"Unknown protocol {spec.protocol!r} - use 'grpc', 'http' or 'openai'")


async def _issue(sender: Any, req: Any, start: float, rec: Record) -> Record:
    rec.start = start
    try:
        await sender.send(req, rec)
    except Exception as e:  # broad on purpose, never silent: the error is the request's, in the report
        rec.error = f"{type(e).__name__}: {e}"[:500]
    rec.end = time.perf_counter()
    if sender.spec.on_done is not None:
        sender.spec.on_done(rec)
    return rec


# -- load shapes -----------------------------------------------------------------------------------
async def _closed(
    spec: LoadSpec, concurrency: int, requests: int | None, duration_s: float | None, warmup: int
) -> tuple[list[Record], float]:
    rng = np.random.default_rng(spec.seed)
    sender = _sender(spec)
    try:

        async def workers(count: int | None, deadline: float | None) -> list[Record]:
            out: list[Record] = []
            left = [count]

            async def worker() -> None:
                while (left[0] is None or left[0] > 0) and (
                    deadline is None or time.perf_counter() < deadline
                ):
                    if left[0] is not None:
                        left[0] -= 1
                    tensors, rec = _tensors(spec, rng)
                    out.append(await _issue(sender, sender.request(tensors), time.perf_counter(), rec))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return out

        await workers(warmup, None)
        t0 = time.perf_counter()
        deadline = t0 + duration_s if duration_s else None
        records = await workers(requests if not duration_s else None, deadline)
        return records, time.perf_counter() - t0
    finally:
        await sender.close()


async def _open(
    spec: LoadSpec, rate: float, burstiness: float, requests: int, warmup: int
) -> tuple[list[Record], float]:
    rng = np.random.default_rng(spec.seed)
    sender = _sender(spec)
    try:
        if warmup:
            drawn = [_tensors(spec, rng) for _ in range(warmup)]
            await asyncio.gather(
                *(_issue(sender, sender.request(t), time.perf_counter(), r) for t, r in drawn)
            )
        offsets = arrival_offsets(rate, requests, burstiness, spec.seed)
        reqs = [  # built before the clock starts
            (sender.request(t), r) for t, r in (_tensors(spec, rng) for _ in range(requests))
        ]
        t0 = time.perf_counter() + 0.01
        tasks: list[Awaitable[Record]] = []
        for off, (req, rec) in zip(offsets, reqs, strict=True):
            delay = t0 + off - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(_issue(sender, req, t0 + off, rec)))
        records = list(await asyncio.gather(*tasks))
        return records, time.perf_counter() - t0
    finally:
        await sender.close()


def probe(spec: LoadSpec) -> Record:
    """One request as the load sends them (seeded apart from the load), awaited alone: what the server
    accepts is known before any level starts."""

    async def one() -> Record:
        sender = _sender(spec)
        try:
            tensors, rec = _tensors(spec, np.random.default_rng(spec.seed + 7919))
            return await _issue(sender, sender.request(tensors), time.perf_counter(), rec)
        finally:
            await sender.close()

    hook, spec.on_done = spec.on_done, None
    try:
        return asyncio.run(one())
    finally:
        spec.on_done = hook


def _measure(
    fn: Callable[[], Awaitable[tuple[list[Record], float]]], spec: LoadSpec, load: dict[str, Any]
) -> Run:
    cpu0 = time.process_time()
    records, wall = asyncio.run(fn())
    source = (
        "usage"
        if spec.protocol == "openai"
        else "output_ids"
        if spec.model == ENGINE
        else "num_output_tokens"
        if spec.count_tokens
        else "responses"
    )
    return Run(records, wall, time.process_time() - cpu0, source, load)


def run_closed(
    spec: LoadSpec,
    concurrency: int,
    requests: int | None = 100,
    duration_s: float | None = None,
    warmup: int = 0,
) -> Run:
    """`concurrency` requests always in flight; `requests` of them (or all started within `duration_s`)
    counted, after `warmup` uncounted ones at the same concurrency."""
    load = {
        "mode": "closed",
        "concurrency": concurrency,
        "requests": requests,
        "duration_s": duration_s,
        "warmup": warmup,
    }
    return _measure(lambda: _closed(spec, concurrency, requests, duration_s, warmup), spec, load)


def run_open(
    spec: LoadSpec, rate: float, requests: int = 100, burstiness: float = 1.0, warmup: int = 0
) -> Run:
    """`requests` sent at `rate`/s with gamma(`burstiness`) gaps, whatever the server's speed."""
    load = {"mode": "open", "rate": rate, "burstiness": burstiness, "requests": requests, "warmup": warmup}
    return _measure(lambda: _open(spec, rate, burstiness, requests, warmup), spec, load)
