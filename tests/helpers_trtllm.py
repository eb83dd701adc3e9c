"""trtllm-build helpers shared by the build and engine-repository tests: demo limits, a fake TensorRT-LLM
checkpoint, and running the contract-checking stand-in (standin_trtllm_build.py) as trtllm-build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.facts.formats import FORMATS

STANDIN = Path(__file__).resolve().parent / "standin_trtllm_build.py"
DEMO_LIMITS = {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024, "max_num_tokens": 4096}


def write_checkpoint(path: Path, fmt: str = "none", world: int = 1, kv: str | None = None) -> Path:
    """A fake TensorRT-LLM checkpoint: config.json + empty rank{N}.safetensors (no ModelOpt needed)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architecture": "LlamaForCausalLM",
        "dtype": "bfloat16",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 2048,
        "mapping": {"world_size": world, "tp_size": world, "pp_size": 1},
        "quantization": {"quant_algo": FORMATS[fmt].quant_algo, "kv_cache_quant_algo": kv},
    }
    (path / "config.json").write_text(json.dumps(cfg))
    for r in range(world):
        (path / f"rank{r}.safetensors").write_bytes(b"")
    return path


def standin_env(version: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, STANDIN_TRTLLM_VERSION=version, **extra)
    for knob in ("STANDIN_FAIL", "STANDIN_SLEEP", "STANDIN_PIDFILE"):
        if knob not in extra:
            env.pop(knob, None)
    return env


def run_standin(argv: list[str], version: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run in cwd: like trtllm-build, the stand-in writes model.cache there unless told otherwise."""
    return subprocess.run(
        [sys.executable, str(STANDIN), *argv[1:]],
        env=standin_env(version),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
