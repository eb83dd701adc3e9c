#!/usr/bin/env python3
"""Quantize a ~1B Llama-shaped model (random, seeded) in every format, twice: through LPX's
quantize stage and with bare ModelOpt calls doing the same work, and compare.

Prints, per format: calibration time, export time and peak GPU memory for both, and the
stage's overhead in percent (target: <= 10%). Writes the figures as JSON with --out.

  python scripts/bench_quantize.py                 # ~1.1B (TinyLlama shape), on CUDA when present
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

SHAPES = {  # TinyLlama-1.1B's published shape; 'tiny' for CPU smoke runs
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}
ALL_FORMATS = ["none", "fp8", "int4_awq", "w4a8_awq", "int8_sq", "nvfp4"]


def write_model(dest: Path, shape: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.demo import _train_tokenizer, corpus_text, paragraphs

    torch.manual_seed(0)
    tok = _train_tokenizer(paragraphs(corpus_text()), vocab_size=512)
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, architectures=["LlamaForCausalLM"],
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True)
    tok.save_pretrained(dest)
    return dest


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


def bare(ckpt: Path, fmt: str, kv: str, cal, out: Path) -> dict:
    """The same work with ModelOpt and transformers called directly."""
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pipeline.config import Quantization
    from pipeline.recipes import recipe
    from pipeline.stages.quantize import gpu_memory

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    quant_cfg = recipe(Quantization(format=fmt, kv_cache=kv))
    tok = AutoTokenizer.from_pretrained(ckpt)
    t: dict = {}
    mem: dict = {}
    peak_reset()
    gpu_memory("start", mem)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).to(dev).eval()
    t["load_s"] = time.perf_counter() - t0
    gpu_memory("load", mem)
    batches = [tok(cal[i:i + 4], return_tensors="pt", padding=True, truncation=True, max_length=256)
               for i in range(0, len(cal), 4)]
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
        (out / "state").mkdir(parents=True)
        mto.save(model, out / "state" / "modelopt_state.pth")
        export_tensorrt_llm_checkpoint(model, "llama", torch.bfloat16, out / "trtllm", inference_tensor_parallel=1)
        gpu_memory("export_trtllm", mem)
        m2 = None
        if kv != "int8":  # ModelOpt's unified HF export has no INT8 KV cache (LPX skips it too)
            m2 = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt), dtype=torch.bfloat16).to(dev)
            mto.restore(m2, out / "state" / "modelopt_state.pth")
            if quant_cfg is None:
                m2.save_pretrained(out / "hf")
            else:
                export_hf_checkpoint(m2, torch.bfloat16, out / "hf")
        _sync()
        t["export_s"] = time.perf_counter() - t0
        gpu_memory("export_hf", mem)
    t["peak_gib"] = peak_gib()
    t["gpu_memory_gib"] = mem
    t["peak_above_start_gib"] = above_start(t["peak_gib"], mem)
    del model, m2
    return t


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def lpx_stage(ckpt: Path, fmt: str, kv: str, samples: int, home: Path) -> dict:
    from pipeline.config import parse_config
    from pipeline.progress import Reporter
    from pipeline.runner import Runner
    from pipeline.stages.quantize import gpu_memory

    os.environ["LPX_HOME"] = str(home)
    cfg = parse_config({
        "model": {"name": "bench", "checkpoint": str(ckpt)},
        "variants": [{"name": fmt, "quantization": {"format": fmt, "kv_cache": kv}}],
        "calibration": {"samples": samples, "seq_len": 256, "batch_size": 4},
        "build": {"archs": ["sm100"]},
    })
    from rich.console import Console

    runner = Runner(cfg, Reporter(Console(file=io.StringIO())))
    peak_reset()
    start: dict = {}
    gpu_memory("start", start)
    t0 = time.perf_counter()
    art = runner.quantize(cfg.variants[0])
    wall = time.perf_counter() - t0
    tm = art.manifest["results"]["timings"]
    export = sum(v for k, v in tm.items() if k.startswith(("export_", "save_state")))
    return {"load_s": tm.get("load_s"), "calibrate_s": tm.get("calibrate_s"), "export_s": export,
            "stage_wall_s": wall, "peak_gib": (peak := peak_gib()), "peak_above_start_gib": above_start(peak, start),
            "gpu_memory_gib": {**start, **art.manifest["results"].get("gpu_memory_gib", {})}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--formats", default=",".join(ALL_FORMATS))
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--workdir", type=Path, help="Scratch folder (default: /dev/shm, so disk speed is not measured).")
    args = ap.parse_args()

    import torch

    from pipeline.demo import corpus_text, paragraphs
    from pipeline.progress import quiet_libraries

    quiet_libraries()
    import warnings

    warnings.filterwarnings("ignore")
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="lpx-bench-", dir=args.workdir or (shm if os.access(shm, os.W_OK) else None)))
    ckpt = write_model(work / "ckpt", args.shape)
    warm_ckpt = write_model(work / "warm", "tiny")
    cal = (paragraphs(corpus_text()) * 4)[: args.samples]
    kv_for = {"fp8": "fp8", "w4a8_awq": "fp8", "nvfp4": "fp8", "int8_sq": "int8"}
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"device {device}, shape {args.shape}, {sum(p.stat().st_size for p in ckpt.glob('*.safetensors')) / 2**30:.2f} GiB "
          f"of weights, {len(cal)} calibration samples x <=256 tokens", flush=True)
    # warm-up: ModelOpt compiles its CUDA extensions on first use; keep that out of both timings
    for fmt in args.formats.split(","):
        bare(warm_ckpt, fmt, kv_for.get(fmt, "none"), cal[:4], work / f"warm-{fmt}")
    rows = []
    for fmt in args.formats.split(","):
        kv = kv_for.get(fmt, "none")
        b = bare(ckpt, fmt, kv, cal, work / f"bare-{fmt}")
        s = lpx_stage(ckpt, fmt, kv, len(cal), work / "home")
        bare_total = b["load_s"] + b.get("calibrate_s", 0) + b["export_s"]
        row = {"format": fmt, "kv_cache": kv, "bare": b, "lpx": s, "bare_total_s": bare_total,
               "overhead_pct": 100 * (s["stage_wall_s"] / bare_total - 1)}
        rows.append(row)
        pk = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"{fmt:9} kv={kv:5} calibrate {b.get('calibrate_s', 0):7.2f}s bare / {s['calibrate_s'] or 0:7.2f}s lpx | "
              f"export {b['export_s']:6.2f}s / {s['export_s']:6.2f}s | peak GiB above start "
              f"{pk(b['peak_above_start_gib'])} / {pk(s['peak_above_start_gib'])} | "
              f"total {bare_total:6.2f}s / {s['stage_wall_s']:6.2f}s ({row['overhead_pct']:+.1f}%)", flush=True)
        for who, m in (("bare", b["gpu_memory_gib"]), ("lpx", s["gpu_memory_gib"])):
            if m:
                print(f"    {who:4} GiB allocated/peak after " + ", ".join(
                    f"{k} {v['allocated']:.2f}/{v['peak']:.2f}" for k, v in m.items()), flush=True)
        shutil.rmtree(work / f"bare-{fmt}", ignore_errors=True)
        if args.out:  # after every format: a run cut short keeps what it measured
            args.out.write_text(json.dumps({"device": device, "shape": args.shape, "rows": rows}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
