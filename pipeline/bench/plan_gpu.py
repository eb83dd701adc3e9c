"""scripts/check_plan_gpu.py's check of `lpx plan` against a real GPU: paged KV-cache pools allocated as
PyTorch tensors laid out as TensorRT-LLM's (per layer [blocks, 2, kv_heads, tokens_per_block, head_dim]),
their bytes against the plan's figure (target: within 1%); then the plan's weights plus its fitting number
of sequences allocated, to see that they fit in the GPU's memory.
"""

from __future__ import annotations

import argparse
import json

from ..errors import NotFound

BLOCK = 64  # tokens per KV-cache block
KV_TOKENS = 64 * 1024  # tokens of each pool in the first check


def run(args: argparse.Namespace) -> int:
    import torch

    from ..inspection.plan import load_shape

    if not torch.cuda.is_available():
        raise NotFound("needs a CUDA GPU - run it on a machine that has one")
    shape = load_shape(None, None, args.preset)
    report: dict = {"gpu": torch.cuda.get_device_name(), "preset": args.preset, "kv": {}}
    for name in ("bf16", "fp8", "int8"):
        report["kv"][name] = kv_pool(shape, name)
    report["fit"] = fit(shape, args, report["gpu"])
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


def pool_shape(tokens: int, shape) -> tuple[int, ...]:
    """One layer's paged pool for `tokens` tokens: [blocks, 2 (K and V), kv_heads, BLOCK, head_dim]."""
    return (tokens // BLOCK, 2, shape.kv_heads, BLOCK, shape.head_dim)


def kv_pool(shape, name: str) -> dict:
    """KV_TOKENS tokens of `name` (bf16, fp8, int8) KV cache in every layer: the bytes allocated against
    the plan's; printed."""
    import torch

    from ..inspection.plan import kv_bytes_per_token

    dt = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}[name]
    tokens = KV_TOKENS
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    pools = [torch.empty(pool_shape(tokens, shape), dtype=dt, device="cuda") for _ in range(shape.layers)]
    torch.cuda.synchronize()
    real = torch.cuda.memory_allocated() - before
    planned = kv_bytes_per_token(shape, name) * tokens
    print(
        f"KV {name:5} {tokens} tokens: allocated {real / 2**20:,.1f} MiB, plan {planned / 2**20:,.1f} MiB "
        f"({100 * (real / planned - 1):+.3f}%)",
        flush=True,
    )
    del pools
    torch.cuda.empty_cache()
    return {
        "tokens": tokens,
        "allocated_bytes": real,
        "plan_bytes": planned,
        "error_pct": 100 * (real / planned - 1),
    }


def fit(shape, args: argparse.Namespace, gpu: str) -> dict:
    """The plan's --format weights and its fitting sequences of --seq-len tokens (bf16 KV) allocated at
    once: the memory left; printed."""
    import torch

    from ..facts.gpu import lookup_gpu
    from ..inspection.plan import kv_bytes_per_token, plan

    p = plan(shape, lookup_gpu(args.gpu), seq_len=args.seq_len)
    row = next(r for r in p["formats"] if r["format"] == args.format)
    free, total = torch.cuda.mem_get_info()
    weights = torch.empty(row["weight_bytes"], dtype=torch.uint8, device="cuda")
    seqs = row["fit_sequences"]
    kv_tokens = seqs * (-(-args.seq_len // BLOCK) * BLOCK)
    pools = [
        torch.empty(pool_shape(kv_tokens, shape), dtype=torch.bfloat16, device="cuda")
        for _ in range(shape.layers)
    ]
    torch.cuda.synchronize()
    left, _ = torch.cuda.mem_get_info()
    out = {
        "format": args.format,
        "weight_bytes": row["weight_bytes"],
        "fit_sequences": seqs,
        "seq_len": args.seq_len,
        "kv_bytes": kv_tokens * kv_bytes_per_token(shape, "bf16"),
        "gpu_total_bytes": total,
        "free_before": free,
        "free_after": left,
        "plan_reserve_bytes": total - row["weight_bytes"] - row["kv_pool_bytes"],
    }
    print(
        f"fit: {args.format} weights {row['weight_bytes'] / 1e9:.2f} GB + {seqs} sequences x {args.seq_len} tokens "
        f"of bf16 KV ({out['kv_bytes'] / 1e9:.1f} GB) allocated on {gpu}: "
        f"{left / 2**30:.1f} GiB left of {total / 2**30:.1f} GiB",
        flush=True,
    )
    del pools, weights
    return out
