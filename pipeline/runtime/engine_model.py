"""The request handling of LPX's `tensorrt_llm` Triton python models (model_repo/torch_engine for the
torch target, model_repo/llmapi for the llmapi target): one class, two engines.

Every input of upstream's `tensorrt_llm` model is declared and validated first (validate.py; a bad or
unsupported value is INVALID_ARG); the engine gets the prompt, the length, end ids, temperature /
top_k / top_p / seed and the options in its SUPPORTED -> output_ids [beams, tokens], sequence_length
[beams], num_output_tokens [1] (generated tokens in this response; input tokens echoed with
exclude_input_in_output false are not counted), with return_log_probs output_log_probs [beams, tokens]
(of this response's tokens) and cum_log_probs [beams] (of every token so far), and on the final
response num_input_tokens and the perf-metric timestamps when asked. Sampling
follows TensorRT-LLM: greedy when temperature is 0, top_k is 1, or neither top_k nor top_p is set.

Each request runs on its own thread over the engine's stream of token deltas (in-flight batching
happens in the engine), so execute() returns at once. Streaming sends deltas cut at character
boundaries: tokens whose text ends in an incomplete UTF-8 sequence are held until the character
completes, so a stateless postprocessing can decode every delta on its own. The FINAL flag rides on
the response that carries the last tokens (a separate empty final response can lose the last chunk in
an ensemble: docs/architecture.md, Triton from the nvidia-pytriton wheel).

An engine has `submit(input_ids, max_new_tokens, end_ids=, temperature=, top_k=, top_p=, seed=)`
returning a stream: an iterator of token deltas (list[int]) with a `finished` flag and `cancel()`.
Runs inside Triton's python stub: `triton_python_backend_utils` is imported when first needed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import trace
from .engines.base import ENGINE_OPTIONS
from .limits import input_refusal
from .model_args import CancelWatch, eos_ids_in, model_params, triton_error
from .request_inputs import given_inputs, guide_options, pb_utils, scalar, words
from .tensors import LPX_TRTLLM, TRTLLM_IO
from .validate import FEATURE_DEFAULTS, Limits, RequestError, check

# Every input of upstream's `tensorrt_llm` model: LPX's python models declare them all, read what their
# engine honours and refuse (validate.py) a non-default value of the rest.
ENGINE_INPUTS = tuple(row[0] for row in TRTLLM_IO["latest"]["in"]) + tuple(
    s.name for s in LPX_TRTLLM if s.io == "in"
)
# Honoured here for every engine: counts and timestamps the model itself measures.
MODEL_FEATURES = frozenset({"return_num_input_tokens", "return_perf_metrics"})
# ENGINE_OPTIONS (engines/base.py): request inputs passed to submit() only when the engine honours them

MAX_HOLD = 8  # tokens held at most while waiting for a character to complete


PERF_TIMES = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")


def timestamp(job: dict, delta: list[int]) -> None:
    """Record when the first and the latest tokens came (return_perf_metrics)."""
    perf = job["perf"]
    if perf is None or not delta:
        return
    now = time.time_ns()
    perf.setdefault("first_token_time_ns", now)
    perf["last_token_time_ns"] = now


def eos_ids(folder: Path) -> list[int]:
    """generation_config.json's eos_token_id (an int or a list), else config.json's."""
    return eos_ids_in(folder, "generation_config.json") or eos_ids_in(folder, "config.json")


def ready(tokenizer, pending: list[int], final: bool) -> bool:
    """Send `pending` now? Always with the last tokens; before that, only once its text ends on a
    whole character (no trailing U+FFFD from a partial UTF-8 sequence), or MAX_HOLD tokens wait."""
    if final:
        return True
    if not pending:
        return False
    return len(pending) >= MAX_HOLD or not tokenizer.decode(pending, skip_special_tokens=False).endswith(
        "\ufffd"
    )


def top_tensors(top: list[tuple[list[int], list[float]]]) -> dict[str, np.ndarray]:
    """Per token (ids, log probs) of its k best -> top_log_probs / top_log_prob_ids [1, 1, tokens, k]."""
    k = min((len(ids) for ids, _ in top), default=0)
    ids = np.array([i[:k] for i, _ in top], dtype=np.int32).reshape(1, 1, len(top), k)
    values = np.array([v[:k] for _, v in top], dtype=np.float32).reshape(1, 1, len(top), k)
    return {"top_log_probs": values, "top_log_prob_ids": ids}


def stop_at(tokens: list[int], first_new: int, stops: list[list[int]]) -> int | None:
    """Length of `tokens` up to the end of the first stop sequence that ends at or after `first_new`."""
    for end in range(first_new + 1, len(tokens) + 1):
        if any(end >= len(w) and tokens[end - len(w) : end] == w for w in stops):
            return end
    return None


class GenerationModel:
    """Triton's TritonPythonModel protocol over an engine; subclasses set the attributes in initialize()."""

    label = "tensorrt_llm"  # prefix of error messages
    engine: Any  # has submit(...) -> stream, close()
    tokenizer: Any  # for the character-boundary hold
    cap: int = 0  # serving.max_tokens_cap (0: none)
    eos_ids: list[int]
    exclude_input: bool = True
    bad_words_supported: bool = False
    metrics: Any = None  # a trtllm_metrics.MetricsReporter once start_metrics ran

    def setup(self, args: dict) -> Callable[[str, str], Path]:
        """Read the shared parameters (max_tokens_cap, exclude_input_in_output) from initialize()'s args;
        returns resolve(key, default): a path parameter, relative to the model's folder unless absolute."""
        folder, params = model_params(args)
        self.params = params
        self.cap = int(params.get("max_tokens_cap") or 0)
        self.exclude_input = self.flag("exclude_input_in_output")

        def resolve(key: str, default: str) -> Path:
            p = Path(params.get(key) or default)
            return p if p.is_absolute() else folder / p

        return resolve

    def start_metrics(self, args: dict) -> None:
        """Publish the TensorRT-LLM backend's metric families from this model's engine (trtllm_metrics.py);
        call at the end of initialize(), once the engine exists."""
        from .trtllm_metrics import STATS_CHECK_PERIOD_MS, MetricsReporter

        period_ms = float(self.params.get("stats_check_period_ms") or STATS_CHECK_PERIOD_MS)
        self.metrics = MetricsReporter(
            self.engine.iteration_stats, args["model_name"], args["model_version"], period_ms / 1000
        )

    def flag(self, key: str, default: bool = True) -> bool:
        """A true/false model parameter (set by setup)."""
        return self.params.get(key, str(default)).lower() in ("true", "1", "yes")

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self.parse(request)
            except Exception as exc:
                self._fail(sender, exc)
                continue
            if trace.ON:  # the request's path: Triton handed it to this model
                trace.mark("request", at="stub", tid=job["tid"])
            stream = None
            if getattr(self.engine, "QUICK_START", False):  # the engine has it before the thread starts
                stream = self._submit(job, sender)
                if stream is None:
                    continue
            try:
                threading.Thread(target=self._run, args=(job, sender, stream), daemon=True).start()
            except RuntimeError as exc:  # no thread to be had: the engine must not keep the request
                if stream is not None:
                    stream.cancel()
                self._fail(sender, exc)
        return None

    def limits(self) -> Limits:
        """What this model's engine allows (read from the engine once it exists)."""
        if getattr(self, "_limits", None) is None:
            engine = self.engine
            meta = getattr(engine, "meta", {}) or {}
            self._limits = Limits(
                vocab_size=getattr(engine, "vocab_size", None),
                max_input_len=int(meta.get("max_input_len") or getattr(engine, "max_input_len", 0) or 0),
                max_seq_len=int(meta.get("max_seq_len") or getattr(engine, "max_seq_len", 0) or 0),
                max_tokens_cap=self.cap,
                target=getattr(engine, "TARGET", self.label),
                supported=MODEL_FEATURES | frozenset(getattr(engine, "SUPPORTED", ())),
            )
        return self._limits

    def parse(self, request) -> dict:
        values = given_inputs(request, ENGINE_INPUTS)
        if "input_ids" not in values:
            raise RequestError("input_ids is missing - send the prompt's token ids as input_ids (INT32)")
        ids = values["input_ids"].reshape(-1)
        length = scalar(request, "input_lengths", len(ids))
        if not 0 < length <= len(ids):
            raise RequestError(
                f"input_lengths {length} does not fit the {len(ids)} input_ids sent - send the prompt's length"
            )
        limits = self.limits()
        if refusal := input_refusal(int(length), limits):
            raise RequestError(refusal.message)
        if "request_output_len" not in values:
            raise RequestError("request_output_len is missing - send the number of tokens to generate")
        check(values, limits, n_prompt=int(length))
        if words(request, "bad_words_list") and not self.bad_words_supported:
            raise RequestError(f"bad_words is not supported by {self.label} - leave it empty")
        end_id = scalar(request, "end_id", -1)
        # the request's end_id, then every end-of-sequence id of generation_config.json (may be a list)
        ends = list(dict.fromkeys(([end_id] if end_id >= 0 else []) + self.eos_ids))
        options = {
            name: value
            for name in ENGINE_OPTIONS
            if name in limits.supported
            and (value := scalar(request, name, None, type(FEATURE_DEFAULTS[name]))) is not None
            and value != FEATURE_DEFAULTS[name]
        } | guide_options(request, limits.supported)
        return {
            "input_ids": [int(t) for t in ids[:length]],
            "max_new_tokens": scalar(request, "request_output_len", 0),
            "end_ids": ends or None,
            "temperature": scalar(request, "temperature", 1.0, float),
            "top_k": scalar(request, "runtime_top_k", 0),
            "top_p": scalar(request, "runtime_top_p", 0.0, float),
            "seed": scalar(request, "seed", None),
            "options": options,
            "streaming": scalar(request, "streaming", False, bool),
            "exclude_input": scalar(request, "exclude_input_in_output", self.exclude_input, bool),
            "stops": words(request, "stop_words_list"),
            "count_input": scalar(request, "return_num_input_tokens", False, bool),
            "tid": request.request_id() if trace.ON else None,
            "perf": {"arrival_time_ns": time.time_ns()}
            if scalar(request, "return_perf_metrics", False, bool)
            else None,
        }

    def _submit(self, job: dict, sender):
        """The request to the engine: its stream, or None once the refusal is sent."""
        if trace.ON:  # the request's path: handing it to the engine begins
            trace.mark("request", at="submit", tid=job["tid"])
        try:
            stream = self.engine.submit(
                job["input_ids"],
                job["max_new_tokens"],
                end_ids=job["end_ids"],
                temperature=job["temperature"],
                top_k=job["top_k"],
                top_p=job["top_p"],
                seed=job["seed"],
                **job["options"],
            )
            if job["perf"] is not None:
                job["perf"]["first_scheduled_time_ns"] = time.time_ns()
        except Exception as exc:
            self._fail(sender, exc)
            return None
        return stream

    def _run(self, job: dict, sender, stream=None) -> None:
        """The request's thread: submit it (unless execute() did) and send its responses."""
        if stream is None and (stream := self._submit(job, sender)) is None:
            return
        try:
            if job["streaming"]:
                self._stream(stream, job, sender)
            else:
                tokens = self._collect(stream, job, sender)
                if tokens is None:  # the client cancelled
                    sender.send(flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    echo = job["input_ids"] if not job["exclude_input"] else []
                    logprobs = self._logprobs(stream, 0, len(tokens))
                    self._send(sender, echo + tokens, True, job, generated=len(tokens), logprobs=logprobs)
        except Exception as exc:
            stream.cancel()
            self._fail(sender, exc)
        if self.metrics is not None:  # per request the engine ran, as the backend's reportCustomMetrics
            self.metrics.observe_request(len(job["input_ids"]), len(stream.tokens))

    def _collect(self, stream, job: dict, sender) -> list[int] | None:
        """All tokens of a non-streaming request, cut after a stop sequence; None if the client left."""
        tokens: list[int] = []
        stops = job["stops"]
        gone = CancelWatch(sender)
        for delta in stream:
            if gone():
                stream.cancel()
                return None
            timestamp(job, delta)
            first_new, tokens = len(tokens), tokens + delta
            end = stop_at(tokens, first_new, stops) if stops else None
            if end is not None:
                stream.cancel()
                return tokens[:end]
        return tokens

    def _stream(self, stream, job: dict, sender) -> None:
        sent, tokens = 0, []
        gone = CancelWatch(sender)
        for delta in stream:
            if gone():
                stream.cancel()
                sender.send(flags=pb_utils().TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            timestamp(job, delta)
            first_new, tokens = len(tokens), tokens + delta
            final = stream.finished
            end = stop_at(tokens, first_new, job["stops"]) if job["stops"] else None
            if end is not None:
                stream.cancel()
                tokens, final = tokens[:end], True
            pending = tokens[sent:]
            if not ready(self.tokenizer, pending, final):
                continue  # hold: the last character is not complete yet
            if trace.ON:  # just before Triton's response sender
                trace.mark("stub", id=stream.request_id, tid=job["tid"], n=len(tokens))
            self._send(sender, pending, final, job, logprobs=self._logprobs(stream, sent, len(tokens)))
            sent = len(tokens)
            if final:
                return
        # the engine ended the stream (cancelled or closed)
        self._send(sender, tokens[sent:], True, job, logprobs=self._logprobs(stream, sent, len(tokens)))

    @staticmethod
    def _logprobs(stream, start: int, end: int) -> tuple[list[float], float, list | None] | None:
        """(log probs of tokens[start:end], their sum over tokens[:end], their top-k alternatives or None)
        if the request asked for them."""
        if stream.logprobs is None:
            return None
        top = None if stream.top is None else stream.top[start:end]
        return stream.logprobs[start:end], float(sum(stream.logprobs[:end])), top

    @staticmethod
    def _send(
        sender,
        tokens: list[int],
        final: bool,
        job: dict,
        generated: int | None = None,
        logprobs: tuple[list[float], float, list | None] | None = None,
    ) -> None:
        """One response: the tokens, their count, (output_log_probs, cum_log_probs) when asked, and on the
        final one num_input_tokens and the perf-metric timestamps."""
        pb = pb_utils()
        extra = {}
        if logprobs is not None:
            values, total, top = logprobs
            extra["output_log_probs"] = np.array(values, dtype=np.float32).reshape(1, 1, len(values))
            extra["cum_log_probs"] = np.array([[total]], dtype=np.float32)
            if top is not None:
                extra.update(top_tensors(top))
        if final and job["count_input"]:
            extra["num_input_tokens"] = np.array([[len(job["input_ids"])]], dtype=np.int32)
        if final and job["perf"] is not None:
            for name in PERF_TIMES:
                extra[name] = np.array([[job["perf"].get(name, 0)]], dtype=np.int64)
        out = [
            *(pb.Tensor(name, value) for name, value in extra.items()),
            pb.Tensor("output_ids", np.array([[tokens]], dtype=np.int32).reshape(1, 1, len(tokens))),
            pb.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
            pb.Tensor(
                "num_output_tokens",
                np.array([[len(tokens) if generated is None else generated]], dtype=np.int32),
            ),
        ]
        sender.send(
            pb.InferenceResponse(output_tensors=out),
            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0,
        )

    def _fail(self, sender, exc: Exception) -> None:
        pb = pb_utils()
        message = getattr(exc, "message", None) or str(exc)
        sender.send(
            pb.InferenceResponse(
                error=triton_error(f"{self.label}: {message}", invalid=isinstance(exc, RequestError))
            ),
            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def finalize(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.engine.close()
