"""Cross-checks before building (issue 4) and engine selection for the GPU present."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from pipeline.artifacts import Artifact
from pipeline.config import parse_config
from pipeline.errors import LpxError
from pipeline.facts.gpu import GpuInfo
from pipeline.progress import Reporter
from pipeline.runner import Runner
from pipeline.servers.selection import select

LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
}


def _runner(ckpt, **build):
    cfg = parse_config(
        {
            "model": {"name": "m", "checkpoint": str(ckpt)},
            "variants": [{"name": "bf16"}],
            "build": {"archs": ["sm90"], **build},
        }
    )
    return Runner(cfg, Reporter(Console(file=open("/dev/null", "w"))))


def test_max_seq_len_beyond_positions_is_refused(tiny_checkpoint):
    runner = _runner(tiny_checkpoint, max_input_len=512, max_seq_len=4096)
    with pytest.raises(
        LpxError, match="build.max_seq_len 4096 exceeds the model's max_position_embeddings 2048"
    ):
        runner.check(runner.cfg.variants[0])


def test_weights_that_cannot_fit_the_gpu_name_the_numbers(tmp_path):
    ckpt = tmp_path / "llama70b"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(LLAMA_70B))
    header = b'{"__metadata__":{"format":"pt"}}'  # a valid safetensors file holding no tensors
    (ckpt / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    runner = _runner(ckpt, gpu="l4", max_seq_len=8192, max_input_len=4096)
    with pytest.raises(LpxError) as err:
        runner.check(runner.cfg.variants[0])
    msg = err.value.message
    assert "none weights 141.1 GB" in msg and "> L4" in msg and "larger tp_size" in msg
    fits = _runner(ckpt, gpu="h200", tp_size=2, max_seq_len=8192, max_input_len=4096)
    fits.check(fits.cfg.variants[0])  # 70.6 GB per GPU fits an H200
    with pytest.raises(LpxError, match="build.gpu: unknown GPU 'tpu'"):
        bad = _runner(ckpt, gpu="tpu")
        bad.check(bad.cfg.variants[0])


def _pair(tmp_path, arch: str, version: str | None):
    folder = tmp_path / arch
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"version": version}))
    eng = Artifact(folder, {"arch": arch, "key": arch, "results": {}})
    repo = Artifact(tmp_path / f"repo-{arch}", {"arch": arch, "key": f"r{arch}"})
    return eng, repo


def test_selection_picks_this_gpus_engine_or_refuses(tmp_path):
    pairs = [_pair(tmp_path, "sm89", "1.2.0"), _pair(tmp_path, "sm90", "1.2.0")]
    h200 = GpuInfo("NVIDIA H200", 143771, 0, "9.0")
    assert select(pairs, h200, installed="1.2.0")[0].manifest["arch"] == "sm90"
    with pytest.raises(
        LpxError, match=r"This GPU is NVIDIA A100.*\(sm80\) but the engines were built for sm89, sm90"
    ):
        select(pairs, GpuInfo("NVIDIA A100-SXM4-80GB", 81920, 0, "8.0"), installed="1.2.0")
    with pytest.raises(
        LpxError, match="built with TensorRT-LLM 1.2.0 but this machine has TensorRT-LLM 1.3.0"
    ):
        select(pairs, h200, installed="1.3.0")
    with pytest.raises(LpxError, match=r"No NVIDIA GPU found .* \(sm89, sm90\)"):
        select(pairs, None, installed="1.2.0")
    torch_pair = [(Artifact(tmp_path, {"arch": "any"}), Artifact(tmp_path, {"arch": "any"}))]
    assert select(torch_pair, None) == torch_pair[0]
