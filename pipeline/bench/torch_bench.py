"""scripts/bench_torch.py's measurement: the decode speed of the torch target on real engine folders, with and
without its fast path (issue 33), served in this process by TorchEngine through `lpx bench`'s metrics, and
plain transformers `generate` on the checkpoint as the baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..errors import UsageError
from .options import parse_levels


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab, size=length).tolist() for _ in range(n)]


def generate_baseline(ckpt: Path, n: int, input_len: int, output_len: int, vocab: int) -> dict:
    """transformers' `generate` (greedy, bf16, eos ignored), one request at a time: tok/s and TTFT (the
    time `generate` takes for 1 new token on the same prompt)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()
    ps = prompts(n, input_len, vocab, seed=1)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(torch.tensor([ps[0]]), max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        ttft = []
        for p in ps:
            t0 = time.perf_counter()
            model.generate(torch.tensor([p]), max_new_tokens=1, **kw)
            ttft.append(time.perf_counter() - t0)
        tokens, t0 = 0, time.perf_counter()
        for p in ps:
            out = model.generate(
                torch.tensor([p]), max_new_tokens=output_len, min_new_tokens=output_len, **kw
            )
            tokens += out.shape[1] - len(p)
        wall = time.perf_counter() - t0
    ttft.sort()
    return {"tok_s": tokens / wall, "ttft_ms_p50": 1000 * ttft[len(ttft) // 2], "requests": n}


def run(args: argparse.Namespace) -> int:
    """The baseline (with --generate), then each engine in each --fast mode at each level; the table."""
    from ..progress import quiet_libraries

    quiet_libraries()
    levels = parse_levels(args.concurrency)
    modes = [m.strip() for m in args.fast.split(",")]
    if any(m not in ("on", "off") for m in modes):
        raise UsageError("--fast takes on, off or on,off")
    rows: list[dict] = []

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(rows, indent=2) + "\n")

    if args.generate:
        r = generate_baseline(args.generate, max(3, args.requests), args.input_len, args.output_len, 49152)
        rows.append({"variant": "generate (transformers, bf16)", "fast": "-", "concurrency": 1, **r})
        print(f"generate: {r['tok_s']:.2f} tok/s, TTFT p50 {r['ttft_ms_p50']:.0f} ms", flush=True)
        save()
    for spec in args.engines:
        name, _, path = spec.partition("=")
        for mode in modes:
            for row in engine_rows(name, Path(path), mode, levels, args):
                rows.append(row)
                save()
    print("\nvariant | fast | c | tok/s | TTFT p50 ms")
    for row in rows:
        print(
            f"{row['variant']} | {row['fast']} | {row['concurrency']} | {row['tok_s']:.2f} | {row['ttft_ms_p50']:.0f}"
        )
    return 0


def engine_rows(name: str, path: Path, mode: str, levels: list[int], args):
    """One engine folder loaded with the fast path `mode` (on, off): after a warm-up, one row per level,
    yielded as it is measured (and printed)."""
    from ..runtime.engines.torch_engine import TorchEngine
    from .engine_bench import one_level
    from .metrics import summarize

    t0 = time.perf_counter()
    with TorchEngine(path, fast=mode == "on") as engine:
        load_s = time.perf_counter() - t0
        vocab = engine.vocab_size
        one_level(engine, 1, 1, args.input_len, 4, vocab, seed=99)  # warm-up
        for c in levels:
            n = (args.off_requests if mode == "off" and args.off_requests else args.requests) or max(3, c)
            r = summarize(one_level(engine, c, n, args.input_len, args.output_len, vocab, seed=c))
            row = {
                "variant": name,
                "fast": mode,
                "concurrency": c,
                "requests": n,
                "ok": r["succeeded"],
                "tok_s": r["output_tokens_per_s"],
                "ttft_ms_p50": r["ttft_ms"]["p50"],
                "itl_ms_mean": r["itl_ms"]["mean"],
                "load_s": load_s,
            }
            print(
                f"{name} fast={mode} c={c}: {row['ok']}/{n} ok, {row['tok_s']:.2f} tok/s, "
                f"TTFT p50 {row['ttft_ms_p50']:.0f} ms, ITL {row['itl_ms_mean']:.1f} ms (load {load_s:.1f} s)",
                flush=True,
            )
            yield row
