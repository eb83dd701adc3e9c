#!/usr/bin/env python3
"""Hold `lpx plan` against a real GPU: allocate paged KV-cache pools (PyTorch tensors laid out as
TensorRT-LLM's: per layer [blocks, 2, kv_heads, tokens_per_block, head_dim]) and compare the bytes
the allocator hands out with the plan's figure (target: within 1%); then allocate the plan's
weights plus its fitting number of sequences and check they fit in the GPU's memory.

  python scripts/check_plan_gpu.py --preset llama-3.1-8b --gpu h200 --seq-len 8192 [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BLOCK = 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--format", default="fp8")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch

    from pipeline.facts.gpu import lookup_gpu
    from pipeline.inspection.plan import kv_bytes_per_token, load_shape, plan

    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    shape = load_shape(None, None, args.preset)
    dtypes = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}
    report: dict = {"gpu": torch.cuda.get_device_name(), "preset": args.preset, "kv": {}}
    tokens = 64 * 1024
    for name, dt in dtypes.items():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        pools = [
            torch.empty((tokens // BLOCK, 2, shape.kv_heads, BLOCK, shape.head_dim), dtype=dt, device="cuda")
            for _ in range(shape.layers)
        ]
        torch.cuda.synchronize()
        real = torch.cuda.memory_allocated() - before
        planned = kv_bytes_per_token(shape, name) * tokens
        report["kv"][name] = {
            "tokens": tokens,
            "allocated_bytes": real,
            "plan_bytes": planned,
            "error_pct": 100 * (real / planned - 1),
        }
        print(
            f"KV {name:5} {tokens} tokens: allocated {real / 2**20:,.1f} MiB, plan {planned / 2**20:,.1f} MiB "
            f"({100 * (real / planned - 1):+.3f}%)",
            flush=True,
        )
        del pools
        torch.cuda.empty_cache()

    p = plan(shape, lookup_gpu(args.gpu), seq_len=args.seq_len)
    row = next(r for r in p["formats"] if r["format"] == args.format)
    free, total = torch.cuda.mem_get_info()
    weights = torch.empty(row["weight_bytes"], dtype=torch.uint8, device="cuda")
    seqs = row["fit_sequences"]
    kv_tokens = seqs * (-(-args.seq_len // BLOCK) * BLOCK)
    pools = [
        torch.empty(
            (kv_tokens // BLOCK, 2, shape.kv_heads, BLOCK, shape.head_dim),
            dtype=torch.bfloat16,
            device="cuda",
        )
        for _ in range(shape.layers)
    ]
    torch.cuda.synchronize()
    left, _ = torch.cuda.mem_get_info()
    report["fit"] = {
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
        f"of bf16 KV ({report['fit']['kv_bytes'] / 1e9:.1f} GB) allocated on {report['gpu']}: "
        f"{left / 2**30:.1f} GiB left of {total / 2**30:.1f} GiB",
        flush=True,
    )
    del pools, weights
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
