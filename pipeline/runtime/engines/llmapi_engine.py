"""The llmapi target's engine: TensorRT-LLM's LLM API (PyTorch backend, >= 1.2) over an llmapi build
folder (pipeline/stages/build/llmapi.py), with the same `submit` as `TorchEngine` so that LPX's Triton model
(pipeline/runtime/engine_model.py) serves either.

`tensorrt_llm.LLM(model=<folder>/checkpoint, **llm_api_options.yaml)` runs on
one asyncio loop in a background thread (generate_async needs a running loop in the calling thread);
each request is one `generate_async(ids, sampling_params=..., streaming=True)` whose cumulative
`outputs[0].token_ids` become token deltas on a thread-safe queue. Cancelling calls the result's
`abort()` on that loop. The API facts used here are in tests/contracts/trtllm_llmapi_python.json.

Guided decoding: upstream's inputs (guided_decoding_guide_type / _guide, guides.py) become
`SamplingParams.guided_decoding = GuidedDecodingParams(...)`, enforced by TensorRT-LLM's xgrammar backend
(the LLM is made with guided_decoding_backend="xgrammar"). That backend builds its token table from the
LLM's tokenizer (py_executor_creator.get_guided_decoding_config asserts one), so the LLM loads the
checkpoint's tokenizer (skip_tokenizer_init=False); prompts and answers stay token ids. A guide is
parsed with xgrammar before generate_async, so an invalid one is a LpxError naming the fix.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import yaml

from ...errors import LpxError
from .base import DONE, ENGINE_OPTIONS, DeltaStream, Engine, Request, greedy
from .guides import OPTIONS as GUIDE_OPTIONS
from .guides import ebnf, requested

MODEL_FILE, OPTIONS_FILE = "model.yaml", "llm_api_options.yaml"
STATS_TIMEOUT_S = 0.05  # LLM.get_stats waits at most this long for new iterations


def read_build(folder: Path) -> tuple[dict, dict]:
    """(model.yaml, the LLM-API options) of an llmapi build folder, with a clear error when it is not one."""
    folder = Path(folder)
    try:
        model = yaml.safe_load((folder / MODEL_FILE).read_text(encoding="utf-8")) or {}
        options = (
            yaml.safe_load((folder / str(model.get("options", OPTIONS_FILE))).read_text(encoding="utf-8"))
            or {}
        )
    except (OSError, yaml.YAMLError) as exc:
        raise LpxError(
            f"{folder} is not an llmapi build folder ({exc}) - rebuild it with 'lpx build' "
            "(build.target: llmapi)"
        ) from None
    if (
        not isinstance(model, dict)
        or not isinstance(options, dict)
        or not (folder / str(model.get("model", ""))).is_dir()
    ):
        raise LpxError(
            f"{folder}/{MODEL_FILE} does not name a checkpoint folder beside it - rebuild it with "
            "'lpx build' (build.target: llmapi)"
        )
    return model, options


def sampling_kwargs(temperature: float, top_k: int, top_p: float) -> dict[str, Any]:
    """TensorRT-LLM's request semantics (greedy when temperature is 0, top_k is 1, or neither top_k nor
    top_p is set) as SamplingParams fields: top_k 1 for greedy; None leaves a field unset."""
    if greedy(temperature, top_k, top_p):
        return {"top_k": 1}
    return {
        "temperature": float(temperature),
        "top_k": int(top_k) if top_k > 0 else None,
        "top_p": float(top_p) if 0 < top_p <= 1 else None,
    }


def token_logprobs(output: Any) -> list[float]:
    """The sampled tokens' log probs of a CompletionOutput asked with logprobs=1: each entry is a
    {token id: Logprob} dict (TokenLogprobs) or already a float."""
    out = []
    for token, entry in zip(output.token_ids, output.logprobs or [], strict=False):
        if isinstance(entry, dict):
            entry = entry.get(token) or next(iter(entry.values()))
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def top_logprobs(output: Any, k: int) -> list[tuple[list[int], list[float]]]:
    """Per output token its k best (ids, log probs), best first, from a CompletionOutput asked with
    logprobs=k: each entry a {token id: Logprob} dict holding the top k (and the sampled token)."""
    out = []
    for entry in output.logprobs or []:
        pairs = (
            sorted(((int(t), float(getattr(v, "logprob", v))) for t, v in entry.items()), key=lambda x: -x[1])
            if isinstance(entry, dict)
            else []
        )[:k]
        out.append(([t for t, _ in pairs], [v for _, v in pairs]))
    return out


async def pump(stream: DeltaStream, llm: Any, input_ids: list[int], params: Any) -> None:
    """Runs on the engine's loop: feed `stream` from generate_async's streamed results (kept on
    `stream.result` for abort)."""
    try:
        stream.result = llm.generate_async(input_ids, sampling_params=params, streaming=True)
        async for step in stream.result:
            output = step.outputs[0]
            item = (list(output.token_ids), bool(step.finished))
            if stream.logprobs is not None:
                item += (token_logprobs(output),)
                if stream.top is not None:
                    item += (top_logprobs(output, stream.top_k),)
            stream.queue.put(item)
        stream.queue.put(DONE)
    except asyncio.CancelledError:  # the engine is closing
        stream.queue.put(RuntimeError("llmapi engine closed"))
        raise
    except Exception as exc:
        stream.queue.put(RuntimeError(f"generation failed: {exc}"))


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class LlmApiEngine(Engine):
    """tensorrt_llm.LLM on a background event loop; `submit` as TorchEngine's."""

    TARGET = "llmapi"
    # SamplingParams fields of the same name (tests/contracts/trtllm_llmapi_python.json)
    # (return_log_probs: SamplingParams.logprobs=1, the sampled token's log prob per output token;
    # top_log_probs_k: logprobs=k, the k best per token; seed: SamplingParams.seed); the guide inputs:
    # SamplingParams.guided_decoding (`guided`)
    SUPPORTED = frozenset(ENGINE_OPTIONS) | frozenset(GUIDE_OPTIONS)

    def __init__(self, folder: Path) -> None:
        try:
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.llmapi import GuidedDecodingParams
        except ImportError as exc:
            raise LpxError(
                f"build.target llmapi needs TensorRT-LLM >= 1.2 in the serving environment ({exc}) - "
                "serve from the TensorRT-LLM container, or use build.target: torch"
            ) from None
        self.folder = Path(folder)
        self.meta, options = read_build(self.folder)
        self.max_input_len = int(options.get("max_input_len") or 0)
        self.max_seq_len = int(options.get("max_seq_len") or 0)
        self._sampling, self._guided = SamplingParams, GuidedDecodingParams
        self._ids = itertools.count()
        self._closed = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lpx-llmapi-loop", daemon=True)
        self._thread.start()
        self._last_stats: dict[str, Any] | None = None
        # token ids in, token ids out (LPX's pre/postprocessing own the text), but the LLM loads the
        # checkpoint's tokenizer: the xgrammar backend needs its vocabulary (module docstring); iteration
        # statistics on, for the backend's metric families (iteration_stats)
        self.llm = LLM(
            model=str(self.folder / self.meta["model"]),
            skip_tokenizer_init=False,
            **{"enable_iter_perf_stats": True, "guided_decoding_backend": "xgrammar", **options},
        )

    def check_open(self) -> None:
        if self._closed.is_set():
            raise LpxError("The llmapi engine is closed - restart the server")

    def start(self, request: Request) -> DeltaStream:
        """Start generate_async for the request on the engine's loop."""
        end_ids = request.end_ids
        if not end_ids:
            raise LpxError(
                "No end-of-sequence id: send end_id, or put eos_token_id in the checkpoint's "
                "generation_config.json"
            )
        options = dict(request.options)
        guided = self.guided(options)  # before any engine work: an invalid guide is refused here
        for name in GUIDE_OPTIONS:
            options.pop(name, None)
        want_logprobs = bool(options.pop("return_log_probs", False))
        top_k = int(options.pop("top_log_probs_k", 0)) if want_logprobs else 0
        params = self._sampling(
            max_tokens=request.max_new_tokens,
            end_id=end_ids[0],
            pad_id=end_ids[0],
            stop_token_ids=end_ids[1:] or None,
            include_stop_str_in_output=True,
            detokenize=False,
            seed=request.seed,
            **({"guided_decoding": guided} if guided is not None else {}),
            **({"logprobs": max(1, top_k)} if want_logprobs else {}),
            **options,
            **{
                k: v
                for k, v in sampling_kwargs(request.temperature, request.top_k, request.top_p).items()
                if v is not None
            },
        )
        stream = DeltaStream(f"lpx-{next(self._ids)}", self.cancel)
        if want_logprobs:
            stream.logprobs = []
            if top_k:
                stream.top, stream.top_k = [], top_k
        asyncio.run_coroutine_threadsafe(pump(stream, self.llm, request.input_ids, params), self._loop)
        return stream

    def guided(self, options: dict) -> Any:
        """The request's GuidedDecodingParams (None without a guide), its guide parsed with xgrammar first
        (no tokenizer needed) so that an invalid one is a LpxError naming the fix, not an engine error.
        json -> json_object=True; regex -> regex; ebnf_grammar -> grammar; json_schema -> grammar, the
        schema's EBNF (guides.schema_ebnf), not json=<schema>: TensorRT-LLM would compile json= with its
        own xgrammar settings (whitespace, strictness) and xgrammar's length-bounded string rule, which
        lets control bytes into a JSON string. The EBNF is the grammar the torch target enforces (compact,
        no extra properties, that rule fixed), so both targets answer a schema in the same language."""
        found = requested(options)
        if found is None:
            return None
        guide_type, guide = found
        grammar = ebnf(guide_type, guide)  # parses the guide: an invalid one is a LpxError naming the fix
        if guide_type == "json":
            return self._guided(json_object=True)
        if guide_type == "regex":
            return self._guided(regex=guide)
        return self._guided(grammar=grammar if guide_type == "json_schema" else guide)

    def iteration_stats(self) -> dict[str, Any] | None:
        """TensorRT-LLM's latest IterationStats: LLM.get_stats drains the iterations since the last call (a
        list of dicts, or JSON strings in older releases); with none new, the last one stands, as on the
        backend."""
        if self._closed.is_set():
            return self._last_stats
        for item in self.llm.get_stats(timeout=STATS_TIMEOUT_S) or []:
            self._last_stats = json.loads(item) if isinstance(item, str) else dict(item)
        return self._last_stats

    def cancel(self, stream: DeltaStream) -> None:
        """Abort the request (on the loop, where its result lives); its stream ends at the next read."""

        def abort() -> None:
            if stream.result is not None and not stream.finished:
                stream.result.abort()
            stream.queue.put(DONE)

        if not self._closed.is_set():
            self._loop.call_soon_threadsafe(abort)

    def close(self) -> None:
        """Shut the LLM down and stop the loop. Safe to call twice."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self.llm.shutdown()
        finally:
            try:  # end the requests still streaming, so no task dies with the loop
                asyncio.run_coroutine_threadsafe(_cancel_all(), self._loop).result(timeout=10)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
