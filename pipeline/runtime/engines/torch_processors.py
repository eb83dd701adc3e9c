"""Per-request logits processors LPX adds to transformers' continuous batching (torch target) for what
TensorRT-LLM's requests carry and transformers' per-request processors lack: repetition, presence and
frequency penalties, min_tokens, log probs of the sampled tokens and the top-k alternatives per token.

Semantics follow TensorRT-LLM's sampling config (docs/requests.md):
- repetition_penalty p (> 0, 1 = off): a token already in the sequence (prompt and generated) has its
  logit divided by p when positive, multiplied by p when negative;
- presence_penalty a: a token already in the sequence loses a; frequency_penalty f: it loses f times
  its count in the sequence;
- min_tokens m: the request's end ids cannot be chosen before m tokens are generated;
- applied after temperature and before top-k / top-p, as TensorRT-LLM's penalty kernel does;
- log probs (return_log_probs): of each sampled token under the distribution after temperature and
  penalties, before top-k / top-p truncation (so a greedy request reports the model's own log
  probability of its token, not log 1);
- top_log_probs_k k (with return_log_probs): the k most likely tokens of that same distribution and
  their log probs, best first (exact ties in torch.topk's order, which is not promised across devices).

How: `Penalties` sits right after the temperature warper. For the rows of the batch that need it, it
counts the request's tokens ([rows, vocab] counts from the token history the scheduler keeps), applies
the penalties and min_tokens, and keeps the log-sum-exp of the penalized scores of rows that want log
probs. `LogprobTail` sits last: transformers' own log prob (return_logprobs) is that of the final,
truncated distribution; the tail records, per request and step, log(kept mass) = lse(final) -
lse(penalized), the term that turns it into the log prob before truncation. The engine adds the two.

Both keep Python-side state between prepare_tensor_args and __call__, which is safe because the
engine runs transformers' batching synchronously, without CUDA graphs (TorchEngine sets both).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingTemperatureLogitsWarper,
)

from .torch_sampling import generated_count, install_seeded

# request option -> (type transformers checks, the value that turns it off)
PENALTY_DEFAULTS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
}
OPTION_TYPES: dict[str, type] = {
    "repetition_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "min_tokens": int,
    "return_log_probs": bool,
    "top_log_probs_k": int,
}


class Penalties(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = dict(OPTION_TYPES)
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._rows: list[tuple[int, Any, dict]] = []  # (row in the batch, request state, its options)
        self.lse: dict[int, torch.Tensor] = {}  # row -> log-sum-exp of its penalized scores
        self.top: dict[int, tuple[list[int], list[float]]] = {}  # row -> its k best (ids, log probs)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        self._rows = []
        for row, future in enumerate(requests_with_new_token):
            kwargs = future.state.logit_processor_kwargs
            if any(kwargs.get(k, d) != d for k, d in PENALTY_DEFAULTS.items()) or kwargs.get(
                "return_log_probs"
            ):
                self._rows.append((row, future.state, kwargs))
        flags = torch.zeros(len(requests_with_new_token), dtype=torch.int32)
        flags[[row for row, _, _ in self._rows]] = 1
        return flags

    def __call__(self, scores: torch.FloatTensor, tensor_arg: torch.Tensor) -> torch.FloatTensor:
        self.lse = {}
        rows = [(r, s, k) for r, s, k in self._rows if r < scores.size(0)]
        penalized = [
            (r, s, k) for r, s, k in rows if any(k.get(n, d) != d for n, d in PENALTY_DEFAULTS.items())
        ]
        if penalized:
            scores = scores.clone()
            index = torch.tensor([r for r, _, _ in penalized], device=scores.device)
            sub = scores.index_select(0, index)
            vocab = sub.size(1)
            seqs = [s.initial_tokens + s.generated_tokens for _, s, _ in penalized]
            width = max(len(q) for q in seqs)
            tokens = torch.full((len(seqs), width), vocab, dtype=torch.int64)
            for i, q in enumerate(seqs):
                tokens[i, : len(q)] = torch.tensor(q, dtype=torch.int64)
            counts = torch.zeros(len(seqs), vocab + 1, device=scores.device)
            counts.scatter_add_(
                1, tokens.to(scores.device), torch.ones_like(tokens, dtype=counts.dtype, device=scores.device)
            )
            counts = counts[:, :vocab]
            seen = counts > 0

            def column(name: str) -> torch.Tensor:
                values = [float(k.get(name, PENALTY_DEFAULTS[name])) for _, _, k in penalized]
                return torch.tensor(values, device=scores.device).unsqueeze(-1)

            rep = column("repetition_penalty")
            sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
            sub = sub - column("presence_penalty") * seen - column("frequency_penalty") * counts
            for i, (_, state, kwargs) in enumerate(penalized):
                if generated_count(state) < int(kwargs.get("min_tokens", 0)):
                    ends = [e for e in state._eos_token_ids if 0 <= e < vocab]
                    if ends:
                        sub[i, ends] = float("-inf")
            scores = scores.index_copy(0, index, sub)
        self.top = {}
        for row, _, kwargs in rows:
            if kwargs.get("return_log_probs"):
                self.lse[row] = torch.logsumexp(scores[row], dim=-1)
                k = int(kwargs.get("top_log_probs_k", 0))
                if k > 0:
                    self.top[row] = top_k(scores[row], self.lse[row], k)
        return scores


def top_k(scores: torch.Tensor, lse: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """The k best tokens of one row and their log probs (scores - lse), best first."""
    values, ids = torch.topk(scores.float(), min(k, scores.size(-1)))
    return ids.tolist(), (values - lse.float()).tolist()


class LogprobTail(ContinuousBatchingLogitsProcessor):
    """Last in the list: the seeded rows' draws (torch_sampling.py), then per request id the log of the mass
    top-k / top-p (and a seeded draw) kept at each step."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, head: Penalties) -> None:
        self.head = head
        self.kept: dict[str, list[float]] = {}  # request id -> log(kept mass) per generated token
        self.top: dict[str, list[tuple[list[int], list[float]]]] = {}  # request id -> per token, k best
        self.sampler: Any = None  # torch_sampling.SeededSampler: seeded rows' draws, run first here

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        return torch.zeros(len(requests_with_new_token), dtype=torch.int32)

    def __call__(self, scores: torch.FloatTensor, tensor_arg: torch.Tensor) -> torch.FloatTensor:
        if self.sampler is not None:
            scores = self.sampler.apply(scores)
        if self.head.lse:
            rows = [(r, s) for r, s, _ in self.head._rows if r in self.head.lse]
            final = torch.logsumexp(scores[[r for r, _ in rows]], dim=-1)
            full = torch.stack([self.head.lse[r] for r, _ in rows])
            for (row, state), value in zip(rows, (final - full).tolist(), strict=True):
                self.kept.setdefault(state.request_id, []).append(value)
                if row in self.head.top:
                    self.top.setdefault(state.request_id, []).append(self.head.top[row])
        return scores

    def take(self, request_id: str, logprobs: list[float]) -> list[float]:
        """transformers' log probs of one request's tokens (of the truncated distribution) -> LPX's."""
        kept = self.kept.get(request_id, [])
        return [
            lp + k for lp, k in zip(logprobs, kept, strict=False)
        ]  # kept may hold one more (the last step)

    def take_top(self, request_id: str, n: int) -> list[tuple[list[int], list[float]]] | None:
        """The k best (ids, log probs) of the request's first n tokens (None if it asked for none)."""
        top = self.top.get(request_id)
        return None if top is None else top[:n]

    def forget(self, request_id: str) -> None:
        self.kept.pop(request_id, None)
        self.top.pop(request_id, None)


def install(manager) -> LogprobTail:
    """Put `Penalties` after the temperature warper (first when there is none) and `LogprobTail` last
    in the manager's processor list, with their rows in the argument storage; returns the tail."""
    procs = manager.logit_processor
    head = Penalties()
    tail = LogprobTail(head)
    items = list(procs.logits_processor)
    at = next(
        (i + 1 for i, p in enumerate(items) if isinstance(p, ContinuousBatchingTemperatureLogitsWarper)), 0
    )
    items.insert(at, head)
    items.append(tail)
    procs.logits_processor[:] = items
    procs.tensors_required += 2
    procs._retrieve_processors_kwargs()
    procs.do_processing = True
    tail.sampler = install_seeded(manager)
    return tail
