"""scripts/bench_quantize.py's two runs of the same work: LPX's quantize stage, and bare ModelOpt and
transformers calls following ModelOpt's plain recipe; their timings, peak GPU memory and bytes on disk.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import time
from pathlib import Path


def scratch_dir(shape: str) -> Path | None:
    """/dev/shm (so disk speed is not measured) when it can hold the checkpoint, a state file and one more
    bf16-sized export with room to spare; else the system's temporary folder."""
    from transformers import LlamaConfig

    from ..inspection.plan import shape_from_config, weight_bytes
    from .synthetic import SHAPES

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
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ..config import Quantization
    from ..stages.quantize import gpu_memory
    from ..stages.quantize.recipes import recipe

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
            model = _bare_calibrate(model, quant_cfg, batches, dev, t, mem)
        t0 = time.perf_counter()
        out.mkdir(parents=True)
        both = {"trtllm", "hf"} <= set(exports)
        _bare_state_and_trtllm(model, out, exports, both, mem)
        m2 = model
        if "hf" in exports:
            if both:  # the TensorRT-LLM export changed the weights: a clean copy, ModelOpt's way
                del model
                peak_gc()
                t1 = time.perf_counter()
                # the calibrated model (m2) is freed once this copy exists, as in ModelOpt's recipe
                m2 = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(ckpt), dtype=torch.bfloat16
                ).to(dev)
                _bare_restore(m2, out, exports, t, mem, t1)
            _bare_hf(m2, out, quant_cfg is None, mem)
        _sync()
        t["export_s"] = time.perf_counter() - t0
    t["peak_gib"] = peak_gib()
    t["gpu_memory_gib"] = mem
    t["peak_above_start_gib"] = above_start(t["peak_gib"], mem)
    t["exports"] = list(exports)
    t["disk_bytes"] = tree_bytes(out)
    del m2
    return t


def _bare_calibrate(model, quant_cfg, batches: list, dev: str, t: dict, mem: dict):
    """mtq.quantize over the calibration batches; its time in t["calibrate_s"]."""
    import modelopt.torch.quantization as mtq
    import torch

    from ..stages.quantize import gpu_memory

    def loop(m):
        for b in batches:
            with torch.no_grad():
                m(input_ids=b["input_ids"].to(dev), attention_mask=b["attention_mask"].to(dev))

    t0 = time.perf_counter()
    model = mtq.quantize(model, quant_cfg, loop)
    _sync()
    t["calibrate_s"] = time.perf_counter() - t0
    gpu_memory("calibrate", mem)
    return model


def _bare_state_and_trtllm(model, out: Path, exports: tuple[str, ...], both: bool, mem: dict) -> None:
    """The ModelOpt state (asked for, or needed for the HF export's clean copy) and the TensorRT-LLM export."""
    import modelopt.torch.opt as mto
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    from ..stages.quantize import gpu_memory

    if "state" in exports or both:
        (out / "state").mkdir()
        mto.save(model, out / "state" / "modelopt_state.pth")
    if "trtllm" in exports:
        export_tensorrt_llm_checkpoint(
            model, "llama", torch.bfloat16, out / "trtllm", inference_tensor_parallel=1
        )
        gpu_memory("export_trtllm", mem)


def _bare_restore(m2, out: Path, exports: tuple[str, ...], t: dict, mem: dict, t1: float) -> None:
    """The saved state restored into the clean copy `m2` (begun at `t1`: t["restore_s"])."""
    import modelopt.torch.opt as mto

    from ..stages.quantize import gpu_memory

    mto.restore(m2, out / "state" / "modelopt_state.pth")
    _sync()
    t["restore_s"] = time.perf_counter() - t1
    if "state" not in exports:  # as LPX does: free its disk before the HF export (8b: 15 GiB)
        shutil.rmtree(out / "state")
    gpu_memory("restore", mem)


def _bare_hf(m2, out: Path, plain: bool, mem: dict) -> None:
    """The unified HF export (`plain`: no quantization, save_pretrained)."""
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    from ..stages.quantize import gpu_memory

    if plain:
        m2.save_pretrained(out / "hf")
    else:
        export_hf_checkpoint(m2, torch.bfloat16, out / "hf")
    gpu_memory("export_hf", mem)


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
    from ..config import parse_config

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

    from ..progress import Reporter
    from ..runner import Runner
    from ..stages.quantize import gpu_memory

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
