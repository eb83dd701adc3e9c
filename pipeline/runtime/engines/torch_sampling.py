"""Seeded requests on the torch engine: the same seed and parameters give the same tokens.

transformers' continuous batching samples every row of a batch with one `torch.multinomial` call on the
engine-wide generator, so a request's draws depend on what else ran before and beside it. `SeededSampler`
is a per-request processor (it reads each row's seed while the batch is prepared) whose draw runs at the
start of `LogprobTail`, the last processor - so after top-k / top-p and anything else that shapes the
distribution, wherever that is inserted: for each row whose request carries a seed it draws the token itself - the
inverse CDF of the row's final distribution (float64) at a uniform number from a generator seeded with
(seed, step), so a request's draw at step t depends on its seed, t and its own probabilities only - and
leaves that token the row's only finite score, which the batch's multinomial then has to pick.

The probabilities are the row's own; they are batch-independent in batch-invariant mode
(serving.batch_invariant, batch_invariant.py), which is what makes the text reproduce whatever the batch.
Without it the same seed gives the same draws, but the logits may differ in the last bits with the batch,
so a near-tie can go the other way. The log prob reported for the token is unchanged: LogprobTail adds
back the mass that truncation (here: to one token) removed, as for top-k.
"""

from __future__ import annotations

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """A 64-bit mix (splitmix64's finalizer): nearby (seed, step) pairs get unrelated generator seeds."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def generated_count(state) -> int:
    """Tokens generated so far (a soft-reset request keeps earlier ones in its prompt)."""
    extra = len(state.initial_tokens) - state._true_initial_tokens if state._true_initial_tokens else 0
    return extra + len(state.generated_tokens)


def draw(scores: torch.Tensor, seed: int, step: int) -> int:
    """The token at step `step` of a request seeded `seed`, from one row of final scores (-inf: cut)."""
    probs = torch.softmax(scores.detach().to(device="cpu", dtype=torch.float64), dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(splitmix64(seed ^ splitmix64(step)))
    u = torch.rand(1, generator=gen, dtype=torch.float64) * cdf[-1]
    token = min(int(torch.searchsorted(cdf, u, right=True).item()), probs.numel() - 1)  # mass passes u
    if probs[token] <= 0:  # (u rounded onto the total: the last token that has any mass)
        token = int(probs.nonzero()[-1].item())
    return token


class SeededSampler(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = {"seed": int}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._rows: list[tuple[int, object, int]] = []  # (row, request state, seed)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        self._rows = []
        for row, future in enumerate(requests_with_new_token):
            seed = future.state.logit_processor_kwargs.get("seed")
            if seed is not None:
                self._rows.append((row, future.state, int(seed)))
        return torch.zeros(len(requests_with_new_token), dtype=torch.int32)

    def __call__(self, scores: torch.FloatTensor, tensor_arg: torch.Tensor) -> torch.FloatTensor:
        return scores  # the draw is `apply`, called by LogprobTail (last), after every other processor

    def apply(self, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Each seeded row's token drawn from its final scores, left its only finite score."""
        rows = [(r, s, seed) for r, s, seed in self._rows if r < scores.size(0)]
        if not rows:
            return scores
        scores = scores.clone()
        for row, state, seed in rows:
            token = draw(scores[row], seed, generated_count(state))
            kept = scores[row, token].clone()
            scores[row].fill_(float("-inf"))
            scores[row, token] = kept
        return scores


def install_seeded(manager) -> SeededSampler:
    """Put a SeededSampler right before the last processor (LogprobTail, torch_processors.install),
    which calls its draw."""
    procs = manager.logit_processor
    sampler = SeededSampler()
    items = list(procs.logits_processor)
    items.insert(len(items) - 1, sampler)
    procs.logits_processor[:] = items
    procs.tensors_required += 1
    procs._retrieve_processors_kwargs()
    return sampler
