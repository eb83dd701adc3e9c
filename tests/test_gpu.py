"""Quantization on CUDA (skipped without a GPU; run on the GPU box with `pytest -m gpu`)."""

from __future__ import annotations

import pytest
from rich.console import Console

from pipeline.config import parse_config
from pipeline.progress import Reporter
from pipeline.runner import Runner

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_quantize_and_eval_on_cuda(tiny_checkpoint, isolated_home):
    cfg = parse_config(
        {
            "model": {"name": "tiny", "checkpoint": str(tiny_checkpoint)},
            "variants": [
                {"name": "fp8", "quantization": {"format": "fp8", "kv_cache": "fp8"}},
                {"name": "nvfp4", "quantization": {"format": "nvfp4"}},
            ],
            "calibration": {"samples": 8, "seq_len": 64, "batch_size": 4},
            "evaluation": {"samples": 4, "seq_len": 64},
            "build": {"archs": ["sm100"]},
        }
    )
    runner = Runner(cfg, Reporter(Console(file=open("/dev/null", "w"))))
    outcomes = {o.variant: o for o in runner.run(cfg.variants, "eval")}
    for name in ("fp8", "nvfp4"):
        quantized = outcomes[name].artifacts["quantize"].manifest["results"]
        assert quantized["device"] == "cuda"
        memory = quantized[
            "gpu_memory_gib"
        ]  # allocated / peak after each phase, for finding what set the peak
        assert list(memory) == ["load", "calibrate", "export_trtllm", "export_hf"]
        assert all(0 < m["peak"] and m["allocated"] <= m["peak"] for m in memory.values())
        ev = outcomes[name].artifacts["eval"].manifest["results"]
        assert "skipped" not in ev, ev  # NVFP4's fake-quant runs on CUDA
        assert 0 <= ev["kl_mean"] < 1 and ev["top1_agreement"] > 0.5
