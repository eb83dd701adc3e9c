"""Structured output on the torch target: a grammar logits processor in transformers' continuous batching,
driven by xgrammar (the grammar engine vLLM, SGLang and TensorRT-LLM use).

A request carries upstream's guided-decoding inputs (`guided_decoding_guide_type`, `guided_decoding_guide`,
tensorrtllm_backend's names and types: json, json_schema, regex, ebnf_grammar). `Grammars.compile` turns
them into a compiled grammar for this tokenizer (cached by xgrammar's compiler, so the same schema is
compiled once) when the request is submitted - a guide that does not compile is refused then, naming the
fix. The processor keeps one matcher per request id: before each step it feeds the matcher the tokens the
request generated since the last step, then masks every token the grammar does not allow next. When the
grammar is complete the matcher allows only the end ids, so a request ends on its own once its answer is
whole (max_tokens permitting). JSON is compact (no free whitespace), so that a small or random model
cannot fill its budget with spaces.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

from ...errors import LpxError
from .guides import GUIDE_TYPES, OPTIONS, reason, schema_ebnf

# GUIDE_TYPES, OPTIONS, reason and schema_ebnf live in guides.py (no torch), shared with the llmapi target
__all__ = ["GUIDE_TYPES", "OPTIONS", "GrammarMask", "Grammars", "install", "reason", "schema_ebnf"]
log = logging.getLogger(__name__)


class Grammars:
    """The compiler for one tokenizer and the vocabulary the model scores."""

    def __init__(self, tokenizer: Any, vocab_size: int, end_ids: list[int]) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(end_ids) or None
        )
        self.vocab_size = vocab_size
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)

    def compile(self, guide_type: str, guide: str) -> Any:
        """The compiled grammar of one request's guide; a LpxError naming the fix when it is not one."""
        if guide_type not in GUIDE_TYPES:
            raise LpxError(
                f"guided_decoding_guide_type {guide_type!r} is not supported - send one of "
                f"{', '.join(GUIDE_TYPES)}"
            )
        if guide_type != "json" and not guide:
            raise LpxError(f"guided_decoding_guide is missing - a {guide_type} guide needs its text")
        c = self.compiler
        try:
            if guide_type == "json":
                return c.compile_builtin_json_grammar()
            if guide_type == "json_schema":
                json.loads(guide)
                return c.compile_grammar(schema_ebnf(self.xgr, guide))
            if guide_type == "regex":
                return c.compile_regex(guide)
            return c.compile_grammar(guide)
        except Exception as exc:  # xgrammar's parse errors (RuntimeError / ValueError), bad JSON
            raise LpxError(f"the {guide_type} guide is invalid ({reason(exc)}) - send a valid one") from None


class GrammarMask(ContinuousBatchingLogitsProcessor):
    """First in the processor list: the rows of guided requests keep only the tokens their grammar allows."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.grammars: Grammars | None = None  # set (TorchEngine.grammars) before the first add()
        self._matchers: dict[str, list] = {}  # request id -> [matcher, tokens fed so far]
        self._lock = threading.Lock()
        self._rows: list[int] = []
        self._mask: torch.Tensor | None = None
        self.failed: dict[str, str] = {}  # request id -> the desync found (TorchEngine ends it with an error)

    def add(self, request_id: str, compiled: Any) -> None:
        with self._lock:
            self._matchers[request_id] = [self.grammars.xgr.GrammarMatcher(compiled), 0]

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._matchers.pop(request_id, None)
            self.failed.pop(request_id, None)

    def failure(self, request_id: str) -> str | None:
        """What went wrong with the request's grammar (a token outside it), or None."""
        with self._lock:
            return self.failed.get(request_id)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        """Feed each guided request's new tokens to its matcher and fill its row of the token bitmask."""
        with self._lock:
            found = [
                (row, future.state, self._matchers.get(future.state.request_id))
                for row, future in enumerate(requests_with_new_token)
            ]
        found = [(row, state, m) for row, state, m in found if m is not None]
        self._rows = [row for row, _, _ in found]
        self._mask = None
        if found and self.grammars is not None:
            xgr = self.grammars.xgr
            self._mask = xgr.allocate_token_bitmask(len(requests_with_new_token), self.grammars.vocab_size)
            for row, state, entry in found:
                problem = _advance(entry, _generated(state))
                if problem is not None:
                    log.error("guided request %s: %s - it ends with an error", state.request_id, problem)
                    self.failed.setdefault(state.request_id, problem)
                entry[0].fill_next_token_bitmask(self._mask, row)
        return torch.zeros(len(requests_with_new_token), dtype=torch.int32)

    def __call__(self, scores: torch.FloatTensor, tensor_arg: torch.Tensor) -> torch.FloatTensor:
        rows = [r for r in self._rows if r < scores.size(0)]
        if not rows or self._mask is None or self.grammars is None:
            return scores
        out = scores.float().clone() if scores.dtype != torch.float32 else scores.clone()
        vocab = min(out.size(1), self.grammars.vocab_size)
        view = out[:, :vocab]
        # xgrammar's own kernel on the CPU, plain torch on a GPU: its default there is a Triton kernel, and
        # LPX needs no `triton` package at run time (xgrammar's wheel still asks for it)
        backend = "cpu" if out.device.type == "cpu" else "torch_native"
        self.grammars.xgr.apply_token_bitmask_inplace(
            view, self._mask.to(out.device), indices=rows, backend=backend
        )
        out[:, :vocab] = view
        return out.to(scores.dtype)


def _generated(state) -> list[int]:
    """The tokens a request generated so far (a soft-reset request keeps earlier ones in its prompt)."""
    true_initial = state._true_initial_tokens
    extra = state.initial_tokens[true_initial:] if true_initial else []
    return list(extra) + list(state.generated_tokens)


def _advance(entry: list, generated: list[int]) -> str | None:
    """Feed the matcher the request's tokens it has not seen; what went wrong when one is outside the
    grammar (None when all were accepted). Cannot happen while the mask is applied to the request's own
    row and the request ends on the grammar's stop ids: a failure is a desync, so it is reported (the
    engine ends the request with an error) rather than skipped."""
    matcher, fed = entry
    for at in range(fed, len(generated)):
        token = int(generated[at])
        if matcher.is_terminated() or not matcher.accept_token(token):
            entry[1] = len(generated)
            state = "after the grammar ended" if matcher.is_terminated() else "that the grammar forbids"
            return f"generated token {token} (position {at}) {state}"
    entry[1] = len(generated)
    return None


def install(manager) -> GrammarMask:
    """Put `GrammarMask` first in the manager's processor list (before temperature and penalties), before
    the manager starts (its argument storage is sized then)."""
    procs = manager.logit_processor
    mask = GrammarMask()
    procs.logits_processor.insert(0, mask)
    procs.tensors_required += 1
    procs._retrieve_processors_kwargs()
    procs.do_processing = True
    return mask
