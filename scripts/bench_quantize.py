#!/usr/bin/env python3
"""Quantize a Llama-shaped model (random, seeded) in every format, twice: through LPX's
quantize stage and with bare ModelOpt calls doing the same work, and compare.

"The same work" is the exports LPX writes for --target (engine: the TensorRT-LLM checkpoint,
llmapi: the unified HF checkpoint, torch: the ModelOpt state) plus --exports. Bare ModelOpt follows
its plain recipe: with both the TensorRT-LLM and the HF export it restores a clean copy into a
`from_config` model (random init on the CPU); LPX restores on the meta device (no init).
Bare's outputs are deleted before LPX's run and LPX's after it is measured, so the disk holds the
checkpoint plus one run's exports at a time (8b: 15 GiB + at most ~32 GiB).

Prints, per format: calibration time, export time and peak GPU memory for both, the stage's
overhead in percent, and the bytes each export took on disk. Writes the figures as JSON with --out.

  python scripts/bench_quantize.py                 # ~1.1B (TinyLlama shape), on CUDA when present
  python scripts/bench_quantize.py --shape 8b --formats fp8 --target engine        # Llama-3.1-8B shape
  python scripts/bench_quantize.py --shape 8b --formats fp8 --exports hf           # + the restore path
  python scripts/bench_quantize.py --shape tiny    # a few MB, for a CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.facts.models import DEMO_SHAPE, PUBLISHED, shape_of

_8B = PUBLISHED["llama-3.1-8b"]
SHAPES = {  # TinyLlama-1.1B's and Llama-3.1-8B's published shapes; 'tiny' (the demo's) for CPU smoke runs
    "1b": shape_of("tinyllama-1.1b"),
    "8b": {
        **shape_of("llama-3.1-8b"),
        **{k: _8B[k] for k in ("max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling")},
    },
    "tiny": DEMO_SHAPE,
}
ALL_FORMATS = ["none", "fp8", "int4_awq", "w4a8_awq", "int8_sq", "nvfp4"]


def write_model(dest: Path, shape: str) -> Path:
    """Seeded random bf16 weights, created directly on the GPU when there is one (no CPU init, no copy)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.demo import _train_tokenizer, corpus_text, paragraphs

    torch.manual_seed(0)
    tok = _train_tokenizer(paragraphs(corpus_text()), vocab_size=512)
    cfg = LlamaConfig(
        **{"max_position_embeddings": 4096, **SHAPES[shape]},
        architectures=["LlamaForCausalLM"],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialize in bf16: no fp32 copy of 8B weights
    try:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    del model
    return dest


def scratch_dir(shape: str) -> Path | None:
    """/dev/shm (so disk speed is not measured) when it can hold the checkpoint, a state file and one more
    bf16-sized export with room to spare; else the system's temporary folder."""
    from transformers import LlamaConfig

    from pipeline.inspection.plan import shape_from_config, weight_bytes

    need = (
        3.5
        * weight_bytes(shape_from_config(LlamaConfig(**SHAPES[shape]).to_dict(), shape), "none")[
            "weight_bytes"
        ]
    )
    shm = Path("/dev/shm")
    if os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= need:
        return shm
    print(
        f"/dev/shm cannot hold {need / 2**30:.0f} GiB: working in {tempfile.gettempdir()} (disk speed is measured)"
    )
    return None


def tree_bytes(folder: Path) -> dict[str, int]:
    """Bytes on disk per top-level folder of `folder` (files at the top under '.')."""
    out: dict[str, int] = {}
    for f in folder.rglob("*"):
        if f.is_file():
            top = f.relative_to(folder).parts[0] if len(f.relative_to(folder).parts) > 1 else "."
            out[top] = out.get(top, 0) + f.stat().st_size
    return out


def peak_reset():
    import gc

    import torch

    gc.collect()  # ModelOpt's quantized modules sit in reference cycles: free the last run's model first
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def above_start(peak: float | None, mem: dict) -> float | None:
    """The peak minus what was allocated when the run started: the run's own memory."""
    return None if peak is None or "start" not in mem else peak - mem["start"]["allocated"]


def bare(ckpt: Path, fmt: str, kv: str, cal, out: Path, exports: tuple[str, ...]) -> dict:
    """The same work with ModelOpt and transformers called directly (ModelOpt's plain recipe)."""
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pipeline.config import Quantization
    from pipeline.stages.quantize import gpu_memory
    from pipeline.stages.quantize.recipes import recipe

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    quant_cfg = recipe(Quantization(format=fmt, kv_cache=kv))
    tok = AutoTokenizer.from_pretrained(ckpt)
    if kv == "int8":  # ModelOpt's unified HF export has no INT8 KV cache (LPX skips it too)
        exports = tuple(e for e in exports if e != "hf")
    t: dict = {}
    mem: dict = {}
    peak_reset()
    gpu_memory("start", mem)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).to(dev).eval()
    t["load_s"] = time.perf_counter() - t0
    gpu_memory("load", mem)
    batches = [
        tok(cal[i : i + 4], return_tensors="pt", padding=True, truncation=True, max_length=256)
        for i in range(0, len(cal), 4)
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        if quant_cfg is not None:

            def loop(m):
                for b in batches:
                    with torch.no_grad():
                        m(input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev))

            t0 = time.perf_counter()
            model = mtq.quantize(model, quant_cfg, loop)
            _sync()
            t["calibrate_s"] = time.perf_counter() - t0
            gpu_memory("calibrate", mem)
        t0 = time.perf_counter()
        out.mkdir(parents=True)
        both = {"trtllm", "hf"} <= set(exports)
        if "state" in exports or both:
            (out / "state").mkdir()
            mto.save(model, out / "state" / "modelopt_state.pth")
        if "trtllm" in exports:
            export_tensorrt_llm_checkpoint(
                model, "llama", torch.bfloat16, out / "trtllm", inference_tensor_parallel=1
            )
            gpu_memory("export_trtllm", mem)
        m2 = model
        if "hf" in exports:
            if both:  # the TensorRT-LLM export changed the weights: a clean copy, ModelOpt's way
                del model
                peak_gc()
                t1 = time.perf_counter()
                m2 = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(ckpt), dtype=torch.bfloat16
                ).to(dev)
                mto.restore(m2, out / "state" / "modelopt_state.pth")
                _sync()
                t["restore_s"] = time.perf_counter() - t1
                if "state" not in exports:  # as LPX does: free its disk before the HF export (8b: 15 GiB)
                    shutil.rmtree(out / "state")
                gpu_memory("restore", mem)
            if quant_cfg is None:
                m2.save_pretrained(out / "hf")
            else:
                export_hf_checkpoint(m2, torch.bfloat16, out / "hf")
            gpu_memory("export_hf", mem)
        _sync()
        t["export_s"] = time.perf_counter() - t0
    t["peak_gib"] = peak_gib()
    t["gpu_memory_gib"] = mem
    t["peak_above_start_gib"] = above_start(t["peak_gib"], mem)
    t["exports"] = list(exports)
    t["disk_bytes"] = tree_bytes(out)
    del m2
    return t


def peak_gc():
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def lpx_config(ckpt: Path, fmt: str, kv: str, samples: int, target: str, exports: list[str]):
    from pipeline.config import parse_config

    return parse_config(
        {
            "model": {"name": "bench", "checkpoint": str(ckpt)},
            "variants": [{"name": fmt, "quantization": {"format": fmt, "kv_cache": kv, "exports": exports}}],
            "calibration": {"samples": samples, "seq_len": 256, "batch_size": 4},
            "build": {"archs": ["sm100"], "target": target, "max_input_len": 2048, "max_seq_len": 4096},
        }
    )


def lpx_stage(
    ckpt: Path, fmt: str, kv: str, samples: int, home: Path, target: str, exports: list[str]
) -> dict:
    from rich.console import Console

    from pipeline.progress import Reporter
    from pipeline.runner import Runner
    from pipeline.stages.quantize import gpu_memory

    os.environ["LPX_HOME"] = str(home)
    cfg = lpx_config(ckpt, fmt, kv, samples, target, exports)
    runner = Runner(cfg, Reporter(Console(file=io.StringIO())))
    peak_reset()
    start: dict = {}
    gpu_memory("start", start)
    t0 = time.perf_counter()
    art = runner.quantize(cfg.variants[0])
    wall = time.perf_counter() - t0
    r = art.manifest["results"]
    tm = r["timings"]
    if "restore_s" in tm:  # the clean copy must have come through the meta-device path
        assert any(n.startswith("restore: meta device") for n in r["notes"]), r["notes"]
    export = sum(v for k, v in tm.items() if k.startswith(("export_", "save_state", "restore")))
    disk = tree_bytes(art.path)
    shutil.rmtree(home, ignore_errors=True)  # measured: free the disk for the next format
    return {
        "load_s": tm.get("load_s"),
        "calibrate_s": tm.get("calibrate_s"),
        "export_s": export,
        "restore_s": tm.get("restore_s"),
        "timings": tm,
        "stage_wall_s": wall,
        "peak_gib": (peak := peak_gib()),
        "peak_above_start_gib": above_start(peak, start),
        "exports": r["exports"],
        "notes": r["notes"],
        "export_check": r["export_check"],
        "disk_bytes": disk,
        "disk_estimate": r["disk"],
        "gpu_memory_gib": {**start, **r.get("gpu_memory_gib", {})},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--formats", default=",".join(ALL_FORMATS))
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument(
        "--target",
        choices=["engine", "llmapi", "torch"],
        default="engine",
        help="build.target: decides the exports both runs write (default engine: the TensorRT-LLM checkpoint).",
    )
    ap.add_argument(
        "--exports",
        default="",
        help="Extra exports, as quantization.exports (comma list of trtllm,hf,state).",
    )
    ap.add_argument("--skip-bare", action="store_true", help="Only LPX's stage (saves device time).")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--workdir", type=Path, help="Scratch folder (default: /dev/shm, so disk speed is not measured)."
    )
    args = ap.parse_args()

    import torch

    from pipeline.demo import corpus_text, paragraphs
    from pipeline.progress import quiet_libraries
    from pipeline.stages.quantize import needed_exports

    quiet_libraries()
    import warnings

    warnings.filterwarnings("ignore")
    extra = [e for e in args.exports.split(",") if e]
    work = Path(tempfile.mkdtemp(prefix="lpx-bench-", dir=args.workdir or scratch_dir(args.shape)))
    t0 = time.perf_counter()
    ckpt = write_model(work / "ckpt", args.shape)
    write_s = time.perf_counter() - t0
    warm_ckpt = write_model(work / "warm", "tiny")
    cal = (paragraphs(corpus_text()) * 4)[: args.samples]
    kv_for = {"fp8": "fp8", "w4a8_awq": "fp8", "nvfp4": "fp8", "int8_sq": "int8"}
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
        kv = kv_for.get(fmt, "none")
        bare(warm_ckpt, fmt, kv, cal[:4], work / f"warm-{fmt}", ("trtllm",))
        shutil.rmtree(work / f"warm-{fmt}", ignore_errors=True)
    rows: list[dict] = []

    def dump(done: list[dict]) -> None:
        """After every run: a benchmark cut short keeps what it measured."""
        if args.out:
            head = {"device": device, "shape": args.shape, "target": args.target, "extra_exports": extra}
            args.out.write_text(json.dumps({**head, "checkpoint_write_s": write_s, "rows": done}, indent=2))

    for fmt in args.formats.split(","):
        kv = kv_for.get(fmt, "none")
        cfg = lpx_config(ckpt, fmt, kv, len(cal), args.target, extra)
        exports = needed_exports(cfg, cfg.variants[0])
        b = None
        if not args.skip_bare:
            b = bare(ckpt, fmt, kv, cal, work / f"bare-{fmt}", exports)
            shutil.rmtree(work / f"bare-{fmt}", ignore_errors=True)  # bare's outputs go before LPX's run
            print(
                f"{fmt:9} bare done: {b['load_s'] + b.get('calibrate_s', 0) + b['export_s']:.2f}s", flush=True
            )
            dump(rows + [{"format": fmt, "kv_cache": kv, "target": args.target, "bare": b, "lpx": None}])
        s = lpx_stage(ckpt, fmt, kv, len(cal), work / "home", args.target, extra)
        bare_total = None if b is None else b["load_s"] + b.get("calibrate_s", 0) + b["export_s"]
        row = {
            "format": fmt,
            "kv_cache": kv,
            "target": args.target,
            "exports": list(exports),
            "bare": b,
            "lpx": s,
            "bare_total_s": bare_total,
            "overhead_pct": None if bare_total is None else 100 * (s["stage_wall_s"] / bare_total - 1),
        }
        rows.append(row)
        pk = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        gib = lambda d: f"{sum(d.values()) / 2**30:.2f}"  # noqa: E731
        if b is not None:
            print(
                f"{fmt:9} kv={kv:5} calibrate {b.get('calibrate_s', 0):7.2f}s bare / {s['calibrate_s'] or 0:7.2f}s lpx | "
                f"export {b['export_s']:6.2f}s / {s['export_s']:6.2f}s | peak GiB above start "
                f"{pk(b['peak_above_start_gib'])} / {pk(s['peak_above_start_gib'])} | "
                f"total {bare_total:6.2f}s / {s['stage_wall_s']:6.2f}s ({row['overhead_pct']:+.1f}%)",
                flush=True,
            )
        else:
            print(
                f"{fmt:9} kv={kv:5} lpx: calibrate {s['calibrate_s'] or 0:7.2f}s, export {s['export_s']:6.2f}s, "
                f"peak GiB above start {pk(s['peak_above_start_gib'])}, total {s['stage_wall_s']:6.2f}s",
                flush=True,
            )
        print(
            f"    exports {','.join(exports)}: disk GiB bare {gib(b['disk_bytes']) if b else 'n/a'} / lpx "
            f"{gib(s['disk_bytes'])} ("
            + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in s["disk_bytes"].items())
            + ")"
            f"; restore bare {pk(b.get('restore_s') if b else None)}s / lpx {pk(s['restore_s'])}s",
            flush=True,
        )
        for who, m in (("bare", b["gpu_memory_gib"] if b else {}), ("lpx", s["gpu_memory_gib"])):
            if m:
                print(
                    f"    {who:4} GiB allocated/peak after "
                    + ", ".join(f"{k} {v['allocated']:.2f}/{v['peak']:.2f}" for k, v in m.items()),
                    flush=True,
                )
        dump(rows)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
