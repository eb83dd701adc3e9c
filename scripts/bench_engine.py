#!/usr/bin/env python3
"""Decode speed of LPX's torch engine on this machine's GPU, against the decode roofline.

The engine runs in this process (no Triton: the GPU box has no tritonserver), fed by one thread per
concurrent request with synthetic prompts of exact length; each request's timeline goes through the
same metrics (`pipeline.bench.metrics`) and roofline (`pipeline.bench.roofline`) as `lpx bench`, so
TTFT/ITL/MBU mean what they mean there. The model is a ~1.1B Llama shape with random, seeded
weights, built through LPX's own stages (quantize: none, build: torch target).

  python scripts/bench_engine.py --concurrency 1,8,32 --out engine.json        # on the GPU box
  python scripts/bench_engine.py --shape tiny --concurrency 1,2 --requests 4 --gpu h200   # CPU smoke run
  python scripts/bench_engine.py --shape tiny --modes on,off --concurrency 1,8,32   # cost of batch invariance

--modes runs each level with the batch-invariant attention on (the default) and off (transformers'
packed paged|sdpa) on the same engine folder and prompts, and prints tokens/s side by side.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_engine(ckpt: Path, home: Path, fmt: str = "none", **build) -> Path:
    """quantize (`fmt`) + build (torch target, limits `build`) through LPX's runner; returns the engine folder."""
    from rich.console import Console

    from pipeline.config import parse_config
    from pipeline.progress import Reporter
    from pipeline.runner import Runner

    os.environ["LPX_HOME"] = str(home)
    cfg = parse_config(
        {
            "model": {"name": "bench-engine", "checkpoint": str(ckpt)},
            "variants": [{"name": fmt, "quantization": {"format": fmt}}],
            "calibration": {"samples": 4, "seq_len": 64, "batch_size": 4},
            "build": {"target": "torch", "archs": ["sm90"], **build},
        }
    )
    runner = Runner(cfg, Reporter(Console(file=io.StringIO())))
    variant = cfg.variants[0]
    return runner.build(variant, runner.quantize(variant), "sm90").path


def one_level(
    engine, concurrency: int, requests: int, input_len: int, output_len: int, vocab: int, seed: int
):
    """`concurrency` threads, each sending requests back to back until `requests` have been sent."""
    import numpy as np

    from pipeline.bench.load import Record, Run

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(100, vocab, size=input_len).tolist() for _ in range(requests)]
    left, lock, records = list(range(requests)), threading.Lock(), []

    def worker() -> None:
        while True:
            with lock:
                if not left:
                    return
                i = left.pop()
            rec = Record(start=time.perf_counter())
            try:
                stream = engine.submit(prompts[i], output_len, temperature=0.0)
                rec.sent = rec.start
                for delta in stream:
                    if delta:
                        rec.times.append(time.perf_counter())
                        rec.tokens.append(len(delta))
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
            rec.end = time.perf_counter()
            with lock:
                records.append(rec)

    cpu0, t0 = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return Run(
        records,
        wall,
        time.process_time() - cpu0,
        "output_ids",
        {"mode": "closed", "concurrency": concurrency, "requests": requests, "warmup": 0},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=["1b", "tiny"], default="1b")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument(
        "--requests", type=int, default=0, help="Requests per level (default: 2 x concurrency, >= 4)."
    )
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument(
        "--gpu", help="GPU for the roofline (default: the one torch sees, if LPX's table knows it)."
    )
    ap.add_argument("--modes", default="on", help="Batch-invariant attention: on, off or on,off.")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch
    from bench_quantize import SHAPES, write_model

    from pipeline.bench import report, roofline
    from pipeline.bench.metrics import summarize
    from pipeline.bench.sweep import parse_levels
    from pipeline.progress import quiet_libraries
    from pipeline.runtime.engines.torch_engine import TorchEngine

    quiet_libraries()
    levels = parse_levels(args.concurrency)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    gpu = roofline.roofline_gpu([device], args.gpu)
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="lpx-engine-", dir=shm if os.access(shm, os.W_OK) else None))
    ckpt = write_model(work / "ckpt", args.shape)
    t0 = time.perf_counter()
    seq = args.input_len + args.output_len
    engine_dir = build_engine(
        ckpt,
        work / "home",
        max_batch_size=max(levels),
        max_input_len=args.input_len,
        max_seq_len=seq + 1,
        max_num_tokens=max(2048, args.input_len * 4),
    )
    print(f"device {device}; engine built in {time.perf_counter() - t0:.1f} s at {engine_dir}", flush=True)
    vocab = SHAPES[args.shape]["vocab_size"]
    modes = [m.strip() for m in args.modes.split(",")]
    if not modes or any(m not in ("on", "off") for m in modes):
        raise SystemExit("--modes takes on, off or on,off")
    results, by_mode = [], {}
    for mode in modes:
        with TorchEngine(
            engine_dir, batch_invariant=mode == "on"
        ) as engine:  # on the GPU when torch sees one
            print(f"engine on {next(engine.model.parameters()).device}, batch_invariant {mode}", flush=True)
            one_level(engine, 2, 2, args.input_len, 8, vocab, seed=99)  # warm-up (kernels, allocator)
            for c in levels:
                n = args.requests or max(4, 2 * c)
                r = summarize(one_level(engine, c, n, args.input_len, args.output_len, vocab, seed=c))
                r["batch_invariant"] = mode
                results.append(r)
                by_mode[(mode, c)] = r["output_tokens_per_s"]
                print(
                    f"c={c} ({mode}): {r['succeeded']}/{r['requests']} ok, {r['output_tokens_per_s']:.0f} tok/s, "
                    f"TTFT p50 {r['ttft_ms']['p50']:.1f} ms, ITL mean {r['itl_ms']['mean']:.2f} ms",
                    flush=True,
                )
                doc = {
                    "target": {
                        "url": "in-process",
                        "model": "torch engine",
                        "protocol": "none",
                        "input_len": args.input_len,
                        "output_len": args.output_len,
                        "shape": args.shape,
                    },
                    "results": results,
                    "environment": report.environment(),
                    "device": device,
                }
                if gpu is not None:
                    roofline.roofline(doc, gpu, ckpt, "none", "bf16")
                    print("\n".join(roofline.markdown(doc)[-1:]), flush=True)
                if args.out:  # after every level: a run cut short keeps what it measured
                    args.out.write_text(json.dumps(doc, indent=2, default=str))
    if len(modes) == 2:
        print("\nconcurrency | tok/s invariant on | tok/s off | cost of the mode")
        for c in levels:
            on, off = by_mode[("on", c)], by_mode[("off", c)]
            print(f"{c} | {on:.0f} | {off:.0f} | {100 * (1 - on / off):+.1f}%")
    if gpu is None:
        print("roofline skipped: no known GPU (give --gpu)")
    else:
        print("\n".join(roofline.markdown(doc)))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
