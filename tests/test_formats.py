"""One record per quantization format and KV-cache type (pipeline/facts/formats.py), and the one `refusal()`
every stage asks: a config that no stage could run is refused at `lpx config validate`, with the same
reason the stage would give."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from pipeline.facts import formats


def validate(tmp_path, fmt: str, kv: str, target: str = "torch") -> tuple[int, str]:
    data = {
        "model": {"name": "m", "checkpoint": str(tmp_path)},
        "variants": [{"name": "v", "quantization": {"format": fmt, "kv_cache": kv}}],
        "build": {"target": target},
    }
    (tmp_path / "lpx.yaml").write_text(yaml.safe_dump(data))
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", "config", "validate", "-c", str(tmp_path / "lpx.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return res.returncode, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("fmt", "kv", "target", "said"),
    [
        # on 2eeb7c6 these passed `lpx config validate`; the quantize stage (none + fp8) or the build stage
        # (int8 KV on the targets that load the unified HF checkpoint) refused them once it ran
        ("none", "fp8", "torch", "quantization.kv_cache needs a quantized format"),
        ("fp8", "int8", "vllm", "kv_cache 'int8': ModelOpt's unified HF checkpoint, which build.target vllm"),
        (
            "fp8",
            "int8",
            "llmapi",
            "kv_cache 'int8': ModelOpt's unified HF checkpoint, which build.target llmapi",
        ),
    ],
)
def test_what_no_stage_can_run_is_refused_at_validate(tmp_path, fmt, kv, target, said) -> None:
    code, out = validate(tmp_path, fmt, kv, target)
    assert code == 2 and said in out, out
    assert "Traceback" not in out


def test_what_a_stage_runs_validates(tmp_path) -> None:
    code, out = validate(tmp_path, "fp8", "int8", "engine")  # TensorRT-LLM's checkpoint holds INT8 KV
    assert code == 0, out


def test_every_format_and_kv_cache_is_one_record() -> None:
    assert list(formats.FORMATS) == ["none", "fp8", "int4_awq", "w4a8_awq", "int8_sq", "nvfp4"]
    assert list(formats.KV_CACHES) == ["none", "fp8", "int8"]
    for name, f in formats.FORMATS.items():
        assert f.name == name and set(f.targets) <= set(formats.TARGETS)
        assert (f.modelopt_config is None) == (f.quant_algo is None) == (name == "none")
        assert f.vllm_quantization is None or "vllm" in f.targets
    assert [n for n, f in formats.FORMATS.items() if f.awq] == ["int4_awq", "w4a8_awq"]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(fmt="nvfp4", sm=90), "format 'nvfp4' needs sm100 or newer"),
        (dict(fmt="fp8", kv_cache="fp8", sm=80), "format 'fp8' needs sm89 or newer"),
        (dict(fmt="int4_awq", kv_cache="fp8", sm=80), "kv_cache 'fp8' needs sm89 or newer"),
        (
            dict(fmt="nvfp4", target="torch", gpu=False),
            "format 'nvfp4' is simulated by ModelOpt on CUDA only",
        ),
        (dict(fmt="fp8", target="vllm", gpu=False), "vLLM's CPU platform has no fp8 kernels"),
        (
            dict(fmt="int8_sq", target="llmapi", line="1.3"),
            "TensorRT-LLM 1.3 (build.target llmapi) cannot serve",
        ),
        (dict(fmt="fp8", target="engine", line="1.3"), "build.target engine (trtllm-build) is deprecated"),
    ],
)
def test_refusal_names_the_fact(kwargs, reason) -> None:
    assert formats.refusal(**kwargs).startswith(reason)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(fmt="nvfp4", sm=100),
        dict(
            fmt="nvfp4", sm=100, line="0.16"
        ),  # the config's question: the line's checkpoints are the build's
        dict(fmt="fp8", target="torch", gpu=False),
        dict(fmt="none", target="vllm", gpu=False),
        dict(fmt="fp8", kv_cache="int8", target="engine", line="1.2", sm=90),
    ],
)
def test_refusal_lets_through_what_runs(kwargs) -> None:
    assert formats.refusal(**kwargs) is None


def test_unknown_algo_is_the_lines_question() -> None:
    """What a TensorRT-LLM line's checkpoints hold: the build stage and `lpx matrix` ask it, the config not."""
    assert (
        formats.unknown_algo("nvfp4", "none", "0.16")
        == "format 'nvfp4' (NVFP4) is not known to TensorRT-LLM 0.16"
    )
    assert formats.unknown_algo("nvfp4", "fp8", "1.2") is None
    assert (
        formats.unknown_algo("fp8", "int8", "1.2") is None
    )  # TensorRT-LLM's checkpoint holds an INT8 KV cache
