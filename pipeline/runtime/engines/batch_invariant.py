"""Batch-invariant attention for the `torch` engine: a request's output does not depend on the batch it
shares.

transformers' continuous batching packs every scheduled request into one row: queries
[1, H, sum_q, d] against keys/values [1, H, sum_kv, d] with a block-diagonal additive mask
(`paged|sdpa`). torch's CPU attention kernels then round differently depending on where a request
sits in that row and how long the row is (vectorized exp over 16 lanes vs a scalar tail; softmax
weights rounded to bf16 before the value product), so the same prompt gives logits 1-2 bf16 ulps
apart alone and batched, and greedy decoding flips where the top two logits nearly tie.

`paged|lpx_invariant` instead runs scaled-dot-product attention once per request, on that
request's own slice of q/k/v (cut by `cu_seq_lens_q` / `cu_seq_lens_k`), through transformers' own
`sdpa_attention_forward` with exactly the arguments `generate` would pass for the same request
alone: causal without a mask for a whole prompt, no mask for one decode token, an explicit mask only
for a prompt continued after cached tokens. Each request's attention is then a function of that
request alone. The other ops of a decoder step work row by row (embedding, RMSNorm, RoPE, the MLP
and projection matmuls, ModelOpt's fake quantizers with calibrated static scales), which the tests
check end to end: the same prompt alone and at random places in random batches gives the same
tokens (tests/test_batch_invariance.py). docs/torch-engine.md states the guarantee and its limits.

It is registered through transformers' `AttentionInterface`, the mechanism transformers provides for
custom attention functions; nothing in transformers is patched.
"""

from __future__ import annotations

from typing import Any

NAME = "paged|lpx_invariant"
_registered = False


def register() -> str:
    """Register the attention function with transformers (once per process); returns its name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, paged_invariant_attention)
        _registered = True
    return NAME


def _request_mask(q_len: int, k_len: int, sliding_window: int | None, device):
    """Boolean mask (True = attend) for the last q_len positions of a k_len sequence, or None where
    `sdpa_attention_forward`'s own causal handling applies (as in `generate`)."""
    import torch

    windowed = sliding_window is not None and k_len > sliding_window
    if not windowed and (q_len == 1 or q_len == k_len):
        return None
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    allowed = k_pos <= q_pos
    if windowed:
        allowed &= k_pos > q_pos - sliding_window
    return allowed.view(1, 1, q_len, k_len)


def paged_invariant_attention(
    module: Any,
    query,
    key,
    value,
    attention_mask=None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
):
    """Attention for transformers' continuous batching, computed per request (see the module docstring).

    query: [1, H, sum_q, d]; key/value: this step's new tokens [1, KVH, sum_q, d], written to the paged
    cache and read back with each request's history as [1, KVH, sum_kv, d]. Returns [1, sum_q, H, d]."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = kwargs.pop("cache", None)
    if cache is not None:
        key, value = cache.update(
            key_states=key,
            value_states=value,
            layer_idx=module.layer_idx,
            read_index=kwargs["read_index"],
            write_index=kwargs["write_index"],
        )
        key = key.transpose(0, 1).unsqueeze(0)
        value = value.transpose(0, 1).unsqueeze(0)
    cu_q = kwargs["cu_seq_lens_q"]
    cu_k = kwargs["cu_seq_lens_k"]
    if isinstance(cu_k, dict):  # several layer types (sliding and full attention layers)
        cu_k = cu_k[getattr(module, "attention_type", None) or next(iter(cu_k))]
    sliding_window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    outputs = []
    for i in range(len(bounds_q) - 1):
        (q0, q1), (k0, k1) = bounds_q[i : i + 2], bounds_k[i : i + 2]
        if q1 == q0:  # a padding slot
            continue
        mask = _request_mask(q1 - q0, k1 - k0, sliding_window, query.device)
        out, _ = sdpa_attention_forward(
            module,
            query[:, :, q0:q1],
            key[:, :, k0:k1],
            value[:, :, k0:k1],
            attention_mask=mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=True,
        )
        outputs.append(out)
    total_q = query.shape[2]
    done = bounds_q[-1]
    if done < total_q:  # padded query rows (static shapes): zeros, never read back
        outputs.append(query.new_zeros(1, total_q - done, query.shape[1], query.shape[3]))
    return torch.cat(outputs, dim=1), None
