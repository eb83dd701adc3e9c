"""scripts/bench_quantize.py's run: a Llama-shaped model (random, seeded) quantized in every --formats format
by bare ModelOpt and by LPX's quantize stage (pipeline/bench/quantize_bench.py), one after the other in this
process, each run's figures printed and the rows written to --out after every run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from .quantize_bench import bare, lpx_config, lpx_stage, scratch_dir
from .synthetic import write_model

KV_FOR = {"fp8": "fp8", "w4a8_awq": "fp8", "nvfp4": "fp8", "int8_sq": "int8"}  # each format's KV cache


def run(args: argparse.Namespace) -> int:
    """Write the model, warm ModelOpt up on the tiny shape, then run bare and LPX for each format."""
    import warnings

    import torch

    from ..demo import corpus_text, paragraphs
    from ..progress import quiet_libraries

    quiet_libraries()
    warnings.filterwarnings("ignore")
    extra = [e for e in args.exports.split(",") if e]
    work = Path(tempfile.mkdtemp(prefix="lpx-bench-", dir=args.workdir or scratch_dir(args.shape)))
    t0 = time.perf_counter()
    ckpt = write_model(work / "ckpt", args.shape)
    write_s = time.perf_counter() - t0
    warm_ckpt = write_model(work / "warm", "tiny")
    cal = (paragraphs(corpus_text()) * 4)[: args.samples]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    free = shutil.disk_usage(work).free
    print(
        f"device {device}, shape {args.shape}, {sum(p.stat().st_size for p in ckpt.glob('*.safetensors')) / 2**30:.2f} GiB "
        f"of weights written in {write_s:.1f}s, {len(cal)} calibration samples x <=256 tokens, target {args.target}"
        f"{' + ' + ','.join(extra) if extra else ''}, {free / 2**30:.1f} GiB free in {work}",
        flush=True,
    )
    # warm-up: ModelOpt compiles its CUDA extensions on first use; keep that out of both timings
    for fmt in args.formats.split(","):
        kv = KV_FOR.get(fmt, "none")
        bare(warm_ckpt, fmt, kv, cal[:4], work / f"warm-{fmt}", ("trtllm",))
        shutil.rmtree(work / f"warm-{fmt}", ignore_errors=True)
    rows: list[dict] = []

    def dump(done: list[dict]) -> None:
        """After every run: a benchmark cut short keeps what it measured."""
        if args.out:
            head = {"device": device, "shape": args.shape, "target": args.target, "extra_exports": extra}
            args.out.write_text(json.dumps({**head, "checkpoint_write_s": write_s, "rows": done}, indent=2))

    for fmt in args.formats.split(","):
        rows.append(one_format(args, fmt, ckpt, cal, work, extra, lambda row: dump([*rows, row])))
        print_row(rows[-1])
        dump(rows)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def one_format(
    args: argparse.Namespace, fmt: str, ckpt: Path, cal: list, work: Path, extra: list, dump
) -> dict:
    """Bare ModelOpt's run (unless --skip-bare; its outputs deleted before LPX's run), then LPX's stage:
    the row of both. `dump(row)` saves the rows with bare's alone, before LPX's run."""
    from ..stages.quantize import needed_exports

    kv = KV_FOR.get(fmt, "none")
    cfg = lpx_config(ckpt, fmt, kv, len(cal), args.target, extra)
    exports = needed_exports(cfg, cfg.variants[0])
    b = None
    if not args.skip_bare:
        b = bare(ckpt, fmt, kv, cal, work / f"bare-{fmt}", exports)
        shutil.rmtree(work / f"bare-{fmt}", ignore_errors=True)  # bare's outputs go before LPX's run
        print(f"{fmt:9} bare done: {b['load_s'] + b.get('calibrate_s', 0) + b['export_s']:.2f}s", flush=True)
        dump({"format": fmt, "kv_cache": kv, "target": args.target, "bare": b, "lpx": None})
    s = lpx_stage(ckpt, fmt, kv, len(cal), work / "home", args.target, extra)
    bare_total = None if b is None else b["load_s"] + b.get("calibrate_s", 0) + b["export_s"]
    return {
        "format": fmt,
        "kv_cache": kv,
        "target": args.target,
        "exports": list(exports),
        "bare": b,
        "lpx": s,
        "bare_total_s": bare_total,
        "overhead_pct": None if bare_total is None else 100 * (s["stage_wall_s"] / bare_total - 1),
    }


def _pk(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _gib(d: dict[str, int]) -> str:
    return f"{sum(d.values()) / 2**30:.2f}"


def print_row(row: dict) -> None:
    """One format's lines: times, peaks and totals of both runs (LPX's alone without bare), the exports'
    bytes on disk, and each run's GPU memory after each phase."""
    fmt, kv, b, s, exports = row["format"], row["kv_cache"], row["bare"], row["lpx"], row["exports"]
    if b is not None:
        print(
            f"{fmt:9} kv={kv:5} calibrate {b.get('calibrate_s', 0):7.2f}s bare / {s['calibrate_s'] or 0:7.2f}s lpx | "
            f"export {b['export_s']:6.2f}s / {s['export_s']:6.2f}s | peak GiB above start "
            f"{_pk(b['peak_above_start_gib'])} / {_pk(s['peak_above_start_gib'])} | "
            f"total {row['bare_total_s']:6.2f}s / {s['stage_wall_s']:6.2f}s ({row['overhead_pct']:+.1f}%)",
            flush=True,
        )
    else:
        print(
            f"{fmt:9} kv={kv:5} lpx: calibrate {s['calibrate_s'] or 0:7.2f}s, export {s['export_s']:6.2f}s, "
            f"peak GiB above start {_pk(s['peak_above_start_gib'])}, total {s['stage_wall_s']:6.2f}s",
            flush=True,
        )
    print(
        f"    exports {','.join(exports)}: disk GiB bare {_gib(b['disk_bytes']) if b else 'n/a'} / lpx "
        f"{_gib(s['disk_bytes'])} ("
        + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in s["disk_bytes"].items())
        + ")"
        f"; restore bare {_pk(b.get('restore_s') if b else None)}s / lpx {_pk(s['restore_s'])}s",
        flush=True,
    )
    for who, m in (("bare", b["gpu_memory_gib"] if b else {}), ("lpx", s["gpu_memory_gib"])):
        if m:
            print(
                f"    {who:4} GiB allocated/peak after "
                + ", ".join(f"{k} {v['allocated']:.2f}/{v['peak']:.2f}" for k, v in m.items()),
                flush=True,
            )
