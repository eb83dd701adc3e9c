"""scripts/bench_engine.py's measurement: the decode speed of LPX's torch engine in this process (no Triton),
one thread per concurrent request with synthetic prompts of exact length, through `lpx bench`'s metrics and
the decode roofline; and the engine build through LPX's own stages that scripts/bench_repo.py uses too.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from ..errors import UsageError


def build_engine(ckpt: Path, home: Path, fmt: str = "none", **build) -> Path:
    """quantize (`fmt`) + build (torch target, limits `build`) through LPX's runner; returns the engine folder."""
    from rich.console import Console

    from ..config import parse_config
    from ..progress import Reporter
    from ..runner import Runner

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

    from .load import Record, Run

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


def run(args: argparse.Namespace) -> int:
    """Build the engine for the levels, measure each --modes mode at each level, print and write the figures."""
    import torch

    from ..progress import quiet_libraries
    from . import roofline
    from .options import parse_levels
    from .synthetic import SHAPES, write_model

    quiet_libraries()
    levels = parse_levels(args.concurrency)
    modes = [m.strip() for m in args.modes.split(",")]
    if not modes or any(m not in ("on", "off") for m in modes):
        raise UsageError("--modes takes on, off or on,off")
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
    bench = EngineBench(args, levels, device, gpu, ckpt, SHAPES[args.shape]["vocab_size"])
    for mode in modes:
        bench.measure(engine_dir, mode)
    if len(modes) == 2:
        print("\nconcurrency | tok/s invariant on | tok/s off | cost of the mode")
        for c in levels:
            on, off = bench.by_mode[("on", c)], bench.by_mode[("off", c)]
            print(f"{c} | {on:.0f} | {off:.0f} | {100 * (1 - on / off):+.1f}%")
    if gpu is None:
        print("roofline skipped: no known GPU (give --gpu)")
    else:
        print("\n".join(roofline.markdown(bench.doc)))
    shutil.rmtree(work, ignore_errors=True)
    return 0


class EngineBench:
    """The levels measured so far (`results`, one summary per mode and level), tok/s by (mode, level), and
    the report of them all (`doc`), rewritten to --out after every level."""

    def __init__(self, args, levels: list[int], device: str, gpu, ckpt: Path, vocab: int) -> None:
        self.args, self.levels, self.device = args, levels, device
        self.gpu, self.ckpt, self.vocab = gpu, ckpt, vocab
        self.results: list[dict] = []
        self.by_mode: dict[tuple[str, int], float] = {}
        self.doc: dict = {}

    def measure(self, engine_dir: Path, mode: str) -> None:
        """Every level with the batch-invariant attention `mode` (on, off), after a warm-up."""
        from ..runtime.engines.torch_engine import TorchEngine
        from .metrics import summarize

        args = self.args
        # on the GPU when torch sees one
        with TorchEngine(engine_dir, batch_invariant=mode == "on") as engine:
            print(f"engine on {next(engine.model.parameters()).device}, batch_invariant {mode}", flush=True)
            one_level(engine, 2, 2, args.input_len, 8, self.vocab, seed=99)  # warm-up (kernels, allocator)
            for c in self.levels:
                n = args.requests or max(4, 2 * c)
                r = summarize(one_level(engine, c, n, args.input_len, args.output_len, self.vocab, seed=c))
                r["batch_invariant"] = mode
                self.results.append(r)
                self.by_mode[(mode, c)] = r["output_tokens_per_s"]
                print(
                    f"c={c} ({mode}): {r['succeeded']}/{r['requests']} ok, {r['output_tokens_per_s']:.0f} tok/s, "
                    f"TTFT p50 {r['ttft_ms']['p50']:.1f} ms, ITL mean {r['itl_ms']['mean']:.2f} ms",
                    flush=True,
                )
                self.report()

    def report(self) -> None:
        """The report of the levels so far, with its roofline when the GPU is known; written to --out (a run
        cut short keeps what it measured)."""
        from . import report, roofline

        args = self.args
        self.doc = {
            "target": {
                "url": "in-process",
                "model": "torch engine",
                "protocol": "none",
                "input_len": args.input_len,
                "output_len": args.output_len,
                "shape": args.shape,
            },
            "results": self.results,
            "environment": report.environment(),
            "device": self.device,
        }
        if self.gpu is not None:
            roofline.roofline(self.doc, self.gpu, self.ckpt, "none", "bf16")
            print("\n".join(roofline.markdown(self.doc)[-1:]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(self.doc, indent=2, default=str))
