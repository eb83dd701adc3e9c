"""Batch-invariance probes for the torch engine, in vLLM's shape: a request alone vs the same request at
random places in random batches. Used by tests/test_batch_invariance.py in-process and, to run under
other CPU kernels (`ATEN_CPU_CAPABILITY=avx2` / `default`), as a subprocess:

  python tests/needle.py ENGINE_DIR --mode on|off [--dtype float64] [--kernel-probe]   -> one JSON object

With --kernel-probe it first checks that torch can run bf16 attention under the CPU kernels it was given
(`kernel_probe`); if torch raises, it prints {"unrunnable": error text, ...} instead of running the probes.

Two probes:
- `packed_forward`: teacher-forced logits of token sequences packed into one row the way transformers'
  continuous batching packs them (cu_seq_lens, block-diagonal mask for `paged|sdpa`), each compared with
  the same sequence packed alone: the largest |logit difference| and how many requests differed.
- `engine_needle`: greedy tokens from the running engine, each prompt alone vs in random batches of up
  to 32 with mixed arrival (some requests join while others decode) and a small token budget, so
  prompts are prefilled in chunks that depend on the batch. Divergences are listed with the step.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT_PROMPTS = [
    "The first token of an answer",
    "Bread is made",
    "A good engineer",
    "Numbers tell stories",
    "Rivers run to the sea and the sea",
    "A small model on a small machine",
    "When the night falls",
    "Every test must be able to fail, or it tells us nothing about the code it claims to check",
]


def attn_name(mode: str) -> str:
    from pipeline.runtime.engines import batch_invariant

    return batch_invariant.register() if mode == "on" else "paged|sdpa"


def packed_logits(model, impl: str, group: list[list[int]], leak: bool = False) -> list:
    """Logits of each sequence in `group`, packed into one row with attention implementation `impl`.
    leak=True builds paged|sdpa's mask causal over the whole row instead of block-diagonal: a deliberate
    cross-request leak, the positive control of the float64 check."""
    import torch

    model.set_attn_implementation(impl)
    cu = [0]
    for seq in group:
        cu.append(cu[-1] + len(seq))
    cu_t = torch.tensor(cu, dtype=torch.int32)
    longest = max(len(s) for s in group)
    dev = model.device
    cu_t = cu_t.to(dev)
    kwargs = {
        "input_ids": torch.tensor([[t for s in group for t in s]], device=dev),
        "position_ids": torch.tensor([[p for s in group for p in range(len(s))]], device=dev),
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,
        "max_seqlen_q": longest,
        "max_seqlen_k": longest,
        "use_cache": False,
    }
    if impl == "paged|sdpa":
        total, low = cu[-1], torch.finfo(model.dtype).min
        causal = torch.triu(torch.full((total, total), low, dtype=model.dtype), 1)
        mask = causal.clone() if leak else torch.full((total, total), low, dtype=model.dtype)
        if not leak:
            for a, b in zip(cu, cu[1:], strict=False):
                mask[a:b, a:b] = causal[: b - a, : b - a]
        kwargs["attention_mask"] = mask.view(1, 1, total, total).to(dev)
    with torch.no_grad():
        out = model(**kwargs).logits[0].float()
    return [out[a:b] for a, b in zip(cu, cu[1:], strict=False)]


def probe_model(engine_dir: Path, dtype: str = "bfloat16", device: str | None = None):
    """The engine's restored model, in `dtype` (float64 for the leak check)."""
    from pipeline.runtime.engines.torch_engine import load_model

    model = load_model(engine_dir, device)
    return model.double() if dtype == "float64" else model


def packed_forward(
    engine_dir: Path | None,
    mode: str,
    dtype: str = "bfloat16",
    trials: int = 6,
    seed: int = 0,
    leak: bool = False,
    device: str | None = None,
    model=None,
    sequences: int = 40,
) -> dict:
    """Each of `sequences` random token sequences alone vs packed into `trials` random batches of 2-32.
    Pass `model` (from probe_model) to reuse one loaded model across calls."""
    import torch

    model = model if model is not None else probe_model(engine_dir, dtype, device)
    dtype = str(model.dtype).removeprefix("torch.")
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    lengths = torch.randint(3, 80, (sequences,), generator=gen).tolist()
    seqs = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]
    impl = attn_name(mode)
    alone = [packed_logits(model, impl, [s])[0] for s in seqs]
    rng = random.Random(seed)
    worst, differing, compared = 0.0, 0, 0
    for _ in range(trials):
        picks = rng.sample(range(len(seqs)), rng.randint(2, min(32, len(seqs))))
        for i, out in zip(
            picks, packed_logits(model, impl, [seqs[i] for i in picks], leak=leak), strict=True
        ):
            diff = (out - alone[i]).abs().max().item()
            worst, differing, compared = max(worst, diff), differing + (diff > 0), compared + 1
    return {
        "probe": "packed_forward",
        "mode": mode,
        "dtype": dtype,
        "leak": leak,
        "max_abs_diff": worst,
        "requests_differing": differing,
        "requests_compared": compared,
    }


def kernel_probe() -> str | None:
    """None if torch runs bf16 scaled-dot-product attention under this process's CPU kernels, else the
    first line of torch's error.

    Why it can fail: torch picks its bf16 flash-attention path from what the CPU has (cpuinfo: AMX lets
    oneDNN pack bf16), not from ATEN_CPU_CAPABILITY; with queries and keys >= 64 long and enough work per
    packed block it packs K and V with at::vec::pack_vnni2, which is only compiled into the AVX-512 kernels.
    So on an AMX CPU under `avx2` or `default`, torch raises "pack_vnni2 is only supported when avx512 is
    supported". The shape here (4 heads, 256 x 256, head size 64, one batch) takes that path at any
    thread count (work per thread / pack size >= 16 > torch's threshold of 4), causal and with a mask
    (the batch-invariant attention uses both), so it fails exactly where the model's prefill would."""
    import torch

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=gen).to(torch.bfloat16) for _ in range(3))
    mask = torch.ones(256, 256, dtype=torch.bool).tril()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        with torch.no_grad():
            sdpa(q, k, v, is_causal=True)
            sdpa(q, k, v, attn_mask=mask)
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0]
    return None


def needle_engine_dir(
    engine_dir: Path, dest: Path, max_batch_size: int = 32, max_num_tokens: int = 96
) -> Path:
    """A copy of `engine_dir` whose limits let 32 requests share a batch and force chunked prefill."""
    if not (dest / "lpx_engine.json").is_file():
        shutil.copytree(engine_dir, dest, dirs_exist_ok=True)
        meta = json.loads((dest / "lpx_engine.json").read_text())
        meta.update(max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)
        (dest / "lpx_engine.json").write_text(json.dumps(meta))
    return dest


def engine_needle(engine_dir: Path, mode: str, rounds: int = 4, new_tokens: int = 24, seed: int = 0) -> dict:
    """Greedy tokens of each prompt alone, then in `rounds` random batches; returns the divergences."""
    from transformers import AutoTokenizer

    from pipeline.runtime.engines.torch_engine import TorchEngine

    tok = AutoTokenizer.from_pretrained(engine_dir)
    prompts = [tok(p)["input_ids"] for p in TEXT_PROMPTS]
    rng = random.Random(seed)
    filler = tok(" ".join(TEXT_PROMPTS))["input_ids"]
    prompts += [filler[: rng.randint(33, len(filler))] for _ in range(4)]  # longer than one KV block
    divergences, compared = [], 0
    with TorchEngine(engine_dir, batch_invariant=mode == "on") as engine:
        alone = [engine.generate(p, new_tokens, temperature=0.0, top_k=1) for p in prompts]
        for rnd in range(rounds):
            picks = [rng.randrange(len(prompts)) for _ in range(rng.randint(2, 32))]
            first, rest = picks[: len(picks) // 2 + 1], picks[len(picks) // 2 + 1 :]
            streams = [engine.submit(prompts[i], new_tokens, temperature=0.0, top_k=1) for i in first]
            if rest and rnd % 2:  # the rest arrive while the first ones decode
                next(iter(streams[0]), None)
            streams += [engine.submit(prompts[i], new_tokens, temperature=0.0, top_k=1) for i in rest]

            def drain(s) -> None:
                for _ in s:
                    pass

            threads = [threading.Thread(target=drain, args=(s,)) for s in streams]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            for i, stream in zip(picks, streams, strict=True):
                compared += 1
                got, want = stream.tokens, alone[i]
                if got != want:
                    step = next(
                        (k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                        min(len(got), len(want)),
                    )
                    divergences.append(
                        {
                            "prompt": i,
                            "step": step,
                            "round": rnd,
                            "batch": len(picks),
                            "prompt_ids": prompts[i],
                            "alone": want,
                            "batched": got,
                        }
                    )
    return {"probe": "engine_needle", "mode": mode, "requests_compared": compared, "divergences": divergences}


def top2_gap(engine_dir: Path, prompt: list[int], tokens: list[int], step: int) -> float:
    """Top-1 minus top-2 logit of an unbatched teacher-forced forward, predicting token `step` after prompt."""
    import torch

    from pipeline.runtime.engines.torch_engine import load_model

    model = load_model(engine_dir)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens[:step]])).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine_dir", type=Path)
    ap.add_argument("--mode", choices=["on", "off"], default="on")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--probe", choices=["packed", "engine", "both"], default="both")
    ap.add_argument(
        "--device", help="where the packed probe runs (the engine picks the GPU when torch sees one)"
    )
    ap.add_argument(
        "--kernel-probe",
        action="store_true",
        help="report (not raise) when torch cannot run bf16 attention under these CPU kernels",
    )
    args = ap.parse_args()
    from pipeline.progress import quiet_libraries

    quiet_libraries()
    import contextlib

    import torch

    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if args.kernel_probe and (error := kernel_probe()) is not None:
        print(json.dumps({**out, "unrunnable": error}))
        return
    with contextlib.redirect_stdout(sys.stderr):  # ModelOpt prints while restoring: keep stdout for the JSON
        if args.probe in ("packed", "both"):
            out["packed"] = packed_forward(args.engine_dir, args.mode, args.dtype, device=args.device)
        if args.probe in ("engine", "both"):
            out["engine"] = engine_needle(args.engine_dir, args.mode)

    out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
