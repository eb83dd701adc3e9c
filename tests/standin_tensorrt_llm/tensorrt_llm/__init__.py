"""A STAND-IN for TensorRT-LLM's Python LLM API, for tests only: TensorRT-LLM cannot be installed on
these machines (docs/architecture.md, What runs where). Put tests/standin_tensorrt_llm on PYTHONPATH and `import tensorrt_llm`
finds this.

It holds LPX's llmapi engine to the interface facts in tests/contracts/: every LLM(...) keyword must be
an LLM constructor parameter or an LLM-API option (trtllm_llmapi_python.json, trtllm_llmapi_options.json),
every SamplingParams field must exist, generate_async takes its documented keywords and must be called
with an asyncio loop running in the calling thread (as the real one asserts), token-id prompts must be
non-empty lists of Python ints, and skip_tokenizer_init requires an explicit end_id. It is not a
TensorRT-LLM: behind the interface it runs transformers' model on the checkpoint folder one token at a
time (greedy for top_k 1, seeded sampling otherwise), one request at a time. With `logprobs` = k it
returns TokenLogprobs ({token id: Logprob} per output token: the k best and the sampled one, of the
temperature-scaled distribution);
penalties and min_tokens are accepted and not applied. With enable_iter_perf_stats, get_stats gives one
IterationStats per step (no kvCacheStats: it has no paged cache).

Guided decoding as the contract says upstream does it: SamplingParams.guided_decoding is a
GuidedDecodingParams (tensorrt_llm.llmapi; at most one guide set); the LLM must be made with
guided_decoding_backend (an LLM-API option), and with a tokenizer (xgrammar's token table: upstream asserts
one, so skip_tokenizer_init=True fails at construction); a guided request to an LLM without the backend
is refused (the C++ executor's check). The guide is enforced with xgrammar on the checkpoint's tokenizer:
each step keeps only the tokens the grammar allows, and once it is complete only the tokenizer's EOS.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__version__ = "1.2.0-lpx-standin"
__all__ = ["LLM", "GuidedDecodingParams", "SamplingParams"]

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
_PY = json.loads((CONTRACTS / "trtllm_llmapi_python.json").read_text())
_OPTIONS = json.loads((CONTRACTS / "trtllm_llmapi_options.json").read_text())
INIT_PARAMS = {k for k in _PY["llm_init"]["params"] if not k.startswith("**")}
OPTION_NAMES = {k for k in _OPTIONS["options"] if "." not in k}
SAMPLING_FIELDS = set(_PY["sampling_params"]["fields"])
GENERATE_PARAMS = set(_PY["generate_async"]["params_1_2_era"]) - {"inputs"}
METHODS = set(_PY["llm_init"]["methods"])
CALLS: list[tuple[str, dict]] = []  # what LPX called, for tests that run the stand-in in-process
GUIDE_FIELDS = set(_PY["guided_decoding_params"]["fields"])
GUIDED_BACKENDS = set(_OPTIONS["options"]["guided_decoding_backend"]["choices"])


class GuidedDecodingParams:
    """Keyword-only, contract-checked fields (json, regex, grammar, json_object, structural_tag); more
    than one guide set is a ValueError when SamplingParams validates it, as upstream's _validate."""

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - GUIDE_FIELDS
        if unknown:
            raise TypeError(f"GuidedDecodingParams got unexpected keyword(s) {sorted(unknown)}")
        self.fields = {"json_object": False, **kwargs}

    def __getattr__(self, name: str) -> Any:
        if name in GUIDE_FIELDS:
            return self.__dict__["fields"].get(name)
        raise AttributeError(name)

    def guides(self) -> dict[str, Any]:
        return {k: v for k, v in self.fields.items() if v}


class SamplingParams:
    """Keyword-only, contract-checked fields; unset fields read as None (the real defaults that matter
    here: max_tokens 32, detokenize True, include_stop_str_in_output False)."""

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(
                f"SamplingParams got unexpected keyword(s) {sorted(unknown)} (not in the contract)"
            )
        self.fields = {"max_tokens": 32, "detokenize": True, "include_stop_str_in_output": False, **kwargs}
        top_k, top_p, temperature = kwargs.get("top_k"), kwargs.get("top_p"), kwargs.get("temperature")
        if (
            top_k is not None
            and top_k < 0
            or top_p is not None
            and not 0 <= top_p <= 1
            or temperature is not None
            and temperature < 0
        ):
            raise ValueError(f"invalid sampling values top_k={top_k} top_p={top_p} temperature={temperature}")
        guided = kwargs.get("guided_decoding")
        if guided is not None:
            if not isinstance(guided, GuidedDecodingParams):
                raise TypeError("guided_decoding must be a GuidedDecodingParams")
            if len(guided.guides()) > 1:
                raise ValueError(f"Only one guide can be used for a request, but got {len(guided.guides())}.")

    def __getattr__(self, name: str) -> Any:
        if name in SAMPLING_FIELDS:
            return self.__dict__["fields"].get(name)
        raise AttributeError(name)


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    text: str = ""


class RequestOutput:
    """The streamed result: async-iterate it; each step is this same object, updated in place."""

    def __init__(self, prompt_token_ids: list[int]) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput()]
        self.finished = False
        self._aborted = threading.Event()
        self._queue: asyncio.Queue = asyncio.Queue()

    def abort(self) -> None:
        self._aborted.set()

    def aborted(self) -> bool:
        return self._aborted.is_set()

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Exception):
            raise item
        tokens, logprobs, reason = item
        self.outputs[0].token_ids = tokens
        self.outputs[0].logprobs = logprobs
        if reason is not None:
            self.outputs[0].finish_reason = reason
            self.finished = True
        return self


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        unknown = set(kwargs) - INIT_PARAMS - OPTION_NAMES
        if unknown:
            raise ValueError(
                f"LLM got invalid argument(s): {sorted(unknown)} (neither an LLM parameter nor an "
                "LLM-API option in the contract)"
            )
        if kwargs.get("tensor_parallel_size", 1) != 1 or kwargs.get("pipeline_parallel_size", 1) != 1:
            raise RuntimeError("the stand-in runs on one device: tensor/pipeline parallel size must be 1")
        self.guided_backend = kwargs.get("guided_decoding_backend")
        if self.guided_backend is not None and self.guided_backend not in GUIDED_BACKENDS:
            raise ValueError(
                f"guided_decoding_backend {self.guided_backend!r} is not one of {sorted(GUIDED_BACKENDS)}"
            )
        if self.guided_backend is not None and kwargs.get("skip_tokenizer_init"):
            raise AssertionError(  # upstream: get_guided_decoding_config's `assert tokenizer is not None`
                "guided_decoding_backend needs the LLM's tokenizer (skip_tokenizer_init=True leaves none)"
            )
        CALLS.append(("LLM", {"model": model, **kwargs}))
        self.skip_tokenizer_init = bool(kwargs.get("skip_tokenizer_init"))
        self.model_dir = model
        self._compiler = None  # xgrammar's, made with the first guided request
        self.max_seq_len = kwargs.get("max_seq_len")
        self.max_batch_size = int(kwargs.get("max_batch_size") or 2048)
        self._iter_stats = bool(kwargs.get("enable_iter_perf_stats"))
        self._stats: list[dict] = []  # IterationStats since the last get_stats (kept only when enabled)
        self._iter = 0
        self._waiting = 0  # requests waiting for the one-at-a-time lock
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self._lock = threading.Lock()  # one request at a time
        self._shut = False
        self._running: list[tuple[threading.Thread, RequestOutput]] = []

    def generate_async(self, inputs: Any, **kwargs: Any) -> RequestOutput:
        unknown = set(kwargs) - GENERATE_PARAMS
        if unknown:
            raise TypeError(
                f"generate_async got unexpected keyword(s) {sorted(unknown)} (not in the contract)"
            )
        if self._shut:
            raise RuntimeError("LLM is shutting down")
        asyncio.get_running_loop()  # the real one needs a running loop here to stream (AsyncQueue)
        if not (isinstance(inputs, list) and inputs and all(type(t) is int for t in inputs)):
            raise TypeError("the stand-in takes token ids: a non-empty list of Python ints")
        params = kwargs.get("sampling_params") or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError("sampling_params must be a SamplingParams")
        if params.end_id is None and self.skip_tokenizer_init:
            raise ValueError(
                "end_id must be set when skip_tokenizer_init is true (no tokenizer to take it from)"
            )
        if params.stop or params.bad:
            raise RuntimeError("stop/bad strings need the tokenizer: use stop_token_ids")
        if params.guided_decoding is not None and self.guided_backend is None:
            raise RuntimeError(
                "Request is specified with GuidedDecodingParams, but GuidedDecoder is not setup. Please "
                "provide a valid GuidedDecodingConfig to setup GuidedDecoder."
            )
        matcher = self._matcher(params.guided_decoding) if params.guided_decoding is not None else None
        CALLS.append(
            (
                "generate_async",
                {"inputs": inputs, "streaming": kwargs.get("streaming", False), **params.fields},
            )
        )
        result = RequestOutput(list(inputs))
        loop = asyncio.get_running_loop()
        put = lambda item: loop.call_soon_threadsafe(result._queue.put_nowait, item)  # noqa: E731
        worker = threading.Thread(
            target=self._generate,
            args=(list(inputs), params, result, put, bool(kwargs.get("streaming")), matcher),
            daemon=True,
        )
        worker.start()
        self._running = [(t, r) for t, r in self._running if t.is_alive()] + [(worker, result)]
        return result

    def _matcher(self, guided: GuidedDecodingParams) -> Any:
        """An xgrammar matcher for the request's guide, on the checkpoint's tokenizer (EOS its stop id)."""
        import xgrammar
        from transformers import AutoTokenizer

        if self._compiler is None:
            tok = AutoTokenizer.from_pretrained(self.model_dir)
            info = xgrammar.TokenizerInfo.from_huggingface(
                tok, vocab_size=self.model.config.vocab_size, stop_token_ids=[tok.eos_token_id]
            )
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        c, (kind, guide) = self._compiler, next(iter(guided.guides().items()))
        if kind == "json_object":
            compiled = c.compile_builtin_json_grammar()
        elif kind == "json":
            compiled = c.compile_json_schema(guide if isinstance(guide, str) else json.dumps(guide))
        elif kind == "regex":
            compiled = c.compile_regex(guide)
        elif kind == "grammar":
            compiled = c.compile_grammar(guide)
        else:
            raise NotImplementedError(f"the stand-in does not enforce {kind}")
        return xgrammar.GrammarMatcher(compiled)

    def _generate(
        self, ids: list[int], params: SamplingParams, result: RequestOutput, put, streaming: bool, matcher
    ) -> None:
        import torch

        try:
            stops = {params.end_id, *(params.stop_token_ids or [])} - {None}
            gen = torch.Generator().manual_seed(int(params.seed or 0))
            tokens: list[int] = []
            logprobs: list[dict[int, Logprob]] = []
            reason = None
            self._waiting += 1
            with self._lock, torch.no_grad():
                self._waiting -= 1
                past, feed = None, torch.tensor([ids])
                while reason is None:
                    self._record(context_tokens=len(ids) if past is None else 0)
                    if result.aborted():
                        reason = "cancelled"
                        break
                    out = self.model(input_ids=feed, past_key_values=past, use_cache=True)
                    past, logits = out.past_key_values, out.logits[0, -1].float()
                    if matcher is not None:  # keep only what the grammar allows next
                        import xgrammar

                        mask = xgrammar.allocate_token_bitmask(1, logits.numel())
                        matcher.fill_next_token_bitmask(mask)
                        logits = logits.unsqueeze(0)
                        xgrammar.apply_token_bitmask_inplace(logits, mask, backend="cpu")
                        logits = logits[0]
                    token = self._pick(logits, params, gen)
                    if matcher is not None and not matcher.is_terminated():
                        matcher.accept_token(token)
                    tokens.append(token)
                    if params.logprobs:
                        lps = torch.log_softmax(logits / (params.temperature or 1.0), -1)
                        best = torch.topk(lps, int(params.logprobs)).indices.tolist()  # the k best + sampled
                        entry = {t: Logprob(float(lps[t]), rank + 1) for rank, t in enumerate(best)}
                        logprobs.append({**entry, token: entry.get(token) or Logprob(float(lps[token]))})
                    if token in stops:
                        reason = "stop"
                        if not params.include_stop_str_in_output and token != params.end_id:
                            tokens.pop()
                            logprobs = logprobs[: len(tokens)]
                    elif len(tokens) >= params.max_tokens:
                        reason = "length"
                    if streaming or reason is not None:
                        put((list(tokens), list(logprobs), reason))
                    feed = torch.tensor([[token]])
            if reason == "cancelled":
                put((list(tokens), list(logprobs), reason))
        except Exception as exc:
            put(RuntimeError(f"stand-in generation failed: {exc}"))

    def _record(self, context_tokens: int) -> None:
        """One iteration's IterationStats (the contract's iteration_stats fields): one request runs at a time,
        the others wait; the stand-in has no paged KV cache, so kvCacheStats is null."""
        self._iter += 1
        if not self._iter_stats:
            return
        now = datetime.now()
        self._stats.append(
            {
                "timestamp": now.strftime("%m-%d-%Y %H:%M:%S.") + f"{now.microsecond:06d}",
                "iter": self._iter,
                "numActiveRequests": 1 + self._waiting,
                "numQueuedRequests": 0,
                "maxNumActiveRequests": self.max_batch_size,
                "cpuMemUsage": 0,
                "gpuMemUsage": 0,
                "pinnedMemUsage": 0,
                "kvCacheStats": None,
                "inflightBatchingStats": {
                    "numScheduledRequests": 1,
                    "numContextRequests": int(context_tokens > 0),
                    "numGenRequests": int(context_tokens == 0),
                    "numPausedRequests": 0,
                    "numCtxTokens": context_tokens,
                    "microBatchId": 0,
                },
            }
        )
        del self._stats[:-1000]

    def get_stats(self, timeout: float | None = 2) -> list[dict]:
        """The iterations since the last call (empty unless made with enable_iter_perf_stats=True)."""
        assert "get_stats(timeout=2)" in METHODS, "LLM.get_stats is not in the contract"
        out, self._stats = self._stats, []
        return out

    @staticmethod
    def _pick(logits, params: SamplingParams, gen) -> int:
        import torch

        if params.top_k == 1 or not params.temperature:
            return int(torch.argmax(logits))
        logits = logits / params.temperature
        if params.top_k:
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, -1)
        if params.top_p:
            order = torch.argsort(probs, descending=True)
            keep = torch.cumsum(probs[order], 0) - probs[order] < params.top_p
            mask = torch.zeros_like(probs, dtype=torch.bool)
            mask[order[keep]] = True
            probs = probs.masked_fill(~mask, 0)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))

    def shutdown(self) -> None:
        """Abort what is running and wait for it, as the real shutdown stops its executor."""
        self._shut = True
        for worker, result in self._running:
            result.abort()
            worker.join(timeout=30)
