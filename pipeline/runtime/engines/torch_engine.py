"""LPX's reference engine for `target: torch`: the restored ModelOpt model behind transformers'
continuous batching (in-flight batching over a paged KV cache). A reference for correctness,
not a production engine.

`TorchEngine.submit` returns a `DeltaStream` (base.py): an iterator of token deltas (lists of new token
ids) whose `finished` attribute is true once the delta just returned is the last one, so a
caller can put a FINAL flag on the last token's response rather than on a separate empty one.
One dispatcher thread routes the manager's outputs to each request's queue; the manager's own
thread runs the batch, so concurrent requests progress together.
"""

from __future__ import annotations

import itertools
import math
import threading
from pathlib import Path
from typing import Any

from ...errors import LpxError
from .base import DONE, DeltaStream, Engine, Request, greedy
from .grammar import Grammars
from .grammar import install as install_grammar
from .guides import OPTIONS as GUIDE_OPTIONS
from .guides import requested
from .torch_meta import read_meta
from .torch_processors import OPTION_TYPES, install
from .torch_stats import TorchStats


def load_model(engine_dir: Path, device: str | None = None, fast: bool | None = None):
    """Rebuild the quantized model: the HF config, then the ModelOpt state and weights (bit-identical),
    built on the meta device and filled by the restore, with no weight initialization (pipeline/runtime/restore.py).
    fast: weights quantized once here and activation / KV quantizers in plain torch, same logits as the
    live ModelOpt model (torch_fast.py); default on, off with fast=False or LPX_TORCH_FAST=0."""
    import torch

    from ..restore import restore_state

    engine_dir = Path(engine_dir)
    meta = read_meta(engine_dir)
    dtype = getattr(torch, meta["dtype"])
    try:
        model, _ = restore_state(engine_dir, engine_dir / meta["state_file"], dtype, device or "cpu")
    except Exception as exc:  # a corrupt or foreign state file
        raise LpxError(
            f"Cannot restore {engine_dir / meta['state_file']}: {exc} - rebuild the engine"
        ) from None
    # torch_fast imports ModelOpt: only here, never at module import (tests/test_cached_path.py)
    from . import torch_fast

    if torch_fast.enabled(fast):
        model.lpx_fast = torch_fast.apply(model)
    return model


def _exact_top1(manager) -> None:
    """Make top_k=1 keep exactly the first maximal token, as `generate`'s argmax does. The stock
    per-request top-k keeps every token tied with the k-th score, and bf16 logits tie often, so
    greedy requests would then sample among the tied tokens."""
    import torch
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingTopKLogitsWarper,
    )

    class ExactTopK(ContinuousBatchingTopKLogitsWarper):
        def __call__(self, scores: torch.FloatTensor, tensor_arg: torch.Tensor) -> torch.FloatTensor:
            out = super().__call__(scores, tensor_arg)
            top1 = (tensor_arg[: scores.size(0)] == 1).unsqueeze(-1)
            if not bool(top1.any()):
                return out
            best = torch.zeros_like(scores, dtype=torch.bool).scatter_(
                -1, scores.argmax(-1, keepdim=True), True
            )
            return out.masked_fill(top1 & ~best, self.filter_value)

    procs = manager.logit_processor.logits_processor
    for i, proc in enumerate(procs):
        if type(proc) is ContinuousBatchingTopKLogitsWarper:
            exact = ExactTopK.__new__(ExactTopK)
            exact.__dict__.update(proc.__dict__)
            procs[i] = exact
            return
    raise LpxError("transformers' continuous batching has no per-request top-k here - use transformers 5.14")


class TorchEngine(Engine):
    """Load an engine dir and serve generation requests through transformers' continuous batching."""

    TARGET = "torch"
    # torch_processors.py: TensorRT-LLM's penalties, min_tokens and log probs, per request
    SUPPORTED = frozenset(OPTION_TYPES) | frozenset(GUIDE_OPTIONS)

    def __init__(
        self,
        engine_dir: Path,
        device: str | None = None,
        seed: int = 0,
        batch_invariant: bool = True,
        tokenizer_dir: Path | None = None,
        fast: bool | None = None,
    ) -> None:
        """device: where the model runs; default the GPU when torch sees one (measured on an H200 with
        scripts/bench_engine.py), else the CPU. batch_invariant: attention per request, so a request's
        tokens do not depend on the batch it shares (batch_invariant.py); off gives transformers' packed
        `paged|sdpa`, faster but 1-2 ulps batch-dependent. tokenizer_dir: the tokenizer guided decoding
        compiles grammars for (default: the engine folder, which holds it). fast: load_model's fast path
        (torch_fast.py; default on unless LPX_TORCH_FAST=0)."""
        import torch

        self.engine_dir = Path(engine_dir)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else self.engine_dir
        self.meta = read_meta(self.engine_dir)
        self.max_input_len, self.max_seq_len = int(self.meta["max_input_len"]), int(self.meta["max_seq_len"])
        self.model = load_model(
            self.engine_dir, device or ("cuda" if torch.cuda.is_available() else None), fast=fast
        )
        self.batch_invariant = bool(batch_invariant)
        if self.batch_invariant:
            from .batch_invariant import register

            self.model.set_attn_implementation(register())
        self.vocab_size = int(self.model.config.vocab_size)
        eos = self.model.config.eos_token_id
        self.default_end_ids = [eos] if isinstance(eos, int) else list(eos or [])
        num_blocks, block = self._init_batching(seed)
        _exact_top1(self._manager)
        self._logprobs = install(self._manager)
        self._grammar = install_grammar(self._manager)  # its compiler is made with the first guided request
        self._grammar_lock = threading.Lock()
        self._stats = TorchStats(self._manager, self.model, self.meta["max_batch_size"], num_blocks, block)
        self._streams: dict[str, DeltaStream] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = threading.Event()
        self._manager.start()
        self._dispatcher = threading.Thread(target=self._dispatch, name="lpx-torch-dispatch", daemon=True)
        self._dispatcher.start()

    def _init_batching(self, seed: int) -> tuple[int, int]:
        """transformers' continuous batching on the model, sized by lpx_engine.json; (KV blocks, block size)."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        # Temperature, top-k and top-p must differ from their neutral values here so that the
        # per-request processors exist; each request then sets all three (see `sampling`).
        gen_cfg = GenerationConfig(
            max_new_tokens=self.meta["max_seq_len"] - 1,
            do_sample=True,
            temperature=0.5,
            top_k=20,
            top_p=0.9,
            eos_token_id=self.default_end_ids,
            pad_token_id=self.model.config.pad_token_id,
        )
        block = int(self.meta["tokens_per_block"])
        num_blocks = math.ceil(self.meta["max_batch_size"] * self.meta["max_seq_len"] / block)
        cb_cfg = ContinuousBatchingConfig(
            block_size=block,
            num_blocks=num_blocks,
            max_batch_tokens=self.meta["max_num_tokens"],
            max_requests_per_batch=self.meta["max_batch_size"],
            per_request_processors=True,
            seed=seed,
            # prefix sharing would make a prompt's prefill depend on what ran before it
            allow_block_sharing=not self.batch_invariant,
            # log probs of the sampled tokens (torch_processors.LogprobTail turns them into LPX's)
            return_logprobs=True,
            # LPX's processors keep per-batch state between preparing a batch and running it
            use_async_batching=False,
            use_cuda_graph=False,
        )
        self._manager = self.model.init_continuous_batching(
            generation_config=gen_cfg, continuous_batching_config=cb_cfg
        )
        return num_blocks, block

    def grammars(self) -> Grammars:
        """The grammar compiler for this model's tokenizer (grammar.py), made with the first guided
        request: the tokenizer's vocabulary is read only when a request needs it."""
        with self._grammar_lock:
            if self._grammar.grammars is None:
                from transformers import AutoTokenizer

                try:
                    tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
                except Exception as exc:
                    raise LpxError(
                        f"guided decoding needs the tokenizer, not readable in {self.tokenizer_dir} ({exc}) - "
                        "set the model's tokenizer_dir parameter"
                    ) from None
                self._grammar.grammars = Grammars(tokenizer, self.vocab_size, self.default_end_ids)
            return self._grammar.grammars

    def sampling(self, temperature: float, top_k: int, top_p: float) -> dict[str, Any]:
        """Per-request processor kwargs with TensorRT-LLM's meaning: greedy when temperature is 0,
        top_k is 1, or neither top_k nor top_p is set (both <= 0); top_k <= 0 means no top-k limit."""
        if greedy(temperature, top_k, top_p):
            return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
        top_k = self.vocab_size if top_k <= 0 else min(int(top_k), self.vocab_size)
        top_p = 1.0 if top_p <= 0 or top_p > 1 else float(top_p)
        return {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}

    def check_open(self) -> None:
        if self._closed.is_set() or not self._manager.is_running():
            raise LpxError(
                f"The torch engine is not running ({self._manager.fatal_error or 'closed'}) - "
                "restart the server; its log has the cause"
            )

    @staticmethod
    def seeded(seed: int | None) -> dict[str, int]:
        """The processor kwarg of a seeded request: its tokens are drawn from its own generator
        (torch_sampling.py), so the same seed and parameters give the same text."""
        return {} if seed is None else {"seed": int(seed) % (1 << 64)}

    def start(self, request: Request) -> DeltaStream:
        """Add the request to the running batch. A seed draws its tokens from the request's own generator
        (torch_sampling.py). Options (SUPPORTED) go to LPX's processors (torch_processors.py); with
        return_log_probs the stream's `logprobs` fill in (and `top`, with top_log_probs_k)."""
        bad = [t for t in request.input_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise LpxError(f"Token ids outside the vocabulary (size {self.vocab_size}): {bad[:5]}")
        stream = DeltaStream(f"lpx-{next(self._ids)}", lambda s: self.cancel(s.request_id))
        options = {n: OPTION_TYPES[n](v) for n, v in request.options.items() if n not in GUIDE_OPTIONS}
        self._guide(stream.request_id, request.options)
        if options.get("return_log_probs"):
            stream.logprobs = []
            if options.get("top_log_probs_k"):
                stream.top = []
        with self._lock:
            self._streams[stream.request_id] = stream
        self._manager.add_request(
            input_ids=request.input_ids,
            request_id=stream.request_id,
            max_new_tokens=request.max_new_tokens,
            streaming=True,
            eos_token_id=request.end_ids or self.default_end_ids,
            **self.sampling(request.temperature, request.top_k, request.top_p),
            **options,
            **self.seeded(request.seed),
        )
        return stream

    def _guide(self, request_id: str, options: dict) -> None:
        """A guided request (guided_decoding_guide_type / _guide, upstream's inputs): its grammar compiled
        and registered before the request joins the batch (grammar.py); an invalid guide is refused."""
        guide = requested(options)
        if guide is None:
            return
        compiled = self.grammars().compile(*guide)
        self._grammar.add(request_id, compiled)

    def iteration_stats(self) -> dict[str, Any]:
        """The engine's state now as TensorRT-LLM's IterationStats (torch_stats.py says what each field is)."""
        return self._stats.read()

    def cancel(self, request_id: str) -> None:
        """Stop a request; its stream ends (without an error) at the next read."""
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            self._manager.cancel_request(request_id)
            self._logprobs.forget(request_id)
            self._grammar.forget(request_id)
            stream.queue.put(DONE)

    def _dispatch(self) -> None:
        while not self._closed.is_set():
            out = self._manager.get_result(timeout=0.1)
            if out is None:
                if not self._manager.is_running() and not self._closed.is_set():
                    self._fail_all(RuntimeError(f"torch engine stopped: {self._manager.fatal_error}"))
                    return
                continue
            desync = self._grammar.failure(out.request_id)
            finished = out.is_finished() or out.error is not None or desync is not None
            if desync is not None and not out.is_finished():
                self._manager.cancel_request(out.request_id)
            with self._lock:
                stream = self._streams.get(out.request_id)
                if stream is not None and finished:
                    del self._streams[out.request_id]
            if stream is None:
                item = None
            elif out.error is not None:
                item = RuntimeError(f"generation failed: {out.error}")
            elif desync is not None:
                item = RuntimeError(f"guided decoding failed: {desync} - a bug; the server log has it")
            elif stream.logprobs is not None:
                logprobs = self._logprobs.take(out.request_id, list(out.logprobs))
                top = self._logprobs.take_top(out.request_id, len(logprobs))
                item = (list(out.generated_tokens), finished, logprobs, top)
            else:
                item = (list(out.generated_tokens), finished)
            if finished:
                self._logprobs.forget(out.request_id)
                self._grammar.forget(out.request_id)
            if item is not None:
                stream.queue.put(item)

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.queue.put(error)

    def close(self) -> None:
        """Stop generation; pending streams end with an error. Safe to call twice."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._manager.stop(block=True, timeout=10, hard_stop=True)
        self._dispatcher.join(timeout=5)
        self._fail_all(RuntimeError("torch engine closed"))
