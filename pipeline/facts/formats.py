"""The quantization formats and KV-cache types LPX offers, and what each needs: the ModelOpt config it
starts from, the oldest GPU architecture that runs it, and the name TensorRT-LLM gives it.

Sources: ModelOpt's support matrix and TensorRT-LLM's precision docs (FP8 needs Ada/Hopper, NVFP4
Blackwell, INT4/INT8 Ampere+); the `quant_algo` names are what ModelOpt writes as
quantization.quant_algo / kv_cache_quant_algo in a TensorRT-LLM checkpoint
(tests/contracts/trtllm_checkpoint.json). Which TensorRT-LLM line knows which name is in facts/trtllm.py.
"""

from __future__ import annotations

# format -> (ModelOpt config name, minimum SM)
FORMATS: dict[str, tuple[str | None, int]] = {
    "none": (None, 70),
    "fp8": ("FP8_DEFAULT_CFG", 89),
    "int4_awq": ("INT4_AWQ_CFG", 80),
    "w4a8_awq": ("W4A8_AWQ_BETA_CFG", 89),
    "int8_sq": ("INT8_SMOOTHQUANT_CFG", 80),
    "nvfp4": ("NVFP4_DEFAULT_CFG", 100),
}
KV_CACHE_TYPES: dict[str, int] = {"none": 70, "fp8": 89, "int8": 80}  # KV-cache type -> minimum SM
QUANT_ALGO: dict[str, str | None] = {
    "none": None,
    "fp8": "FP8",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "nvfp4": "NVFP4",
}
KV_ALGO: dict[str, str | None] = {"none": None, "fp8": "FP8", "int8": "INT8"}
AWQ_FORMATS = ("int4_awq", "w4a8_awq")  # grouped 4-bit weights: awq_block_size applies
CUDA_ONLY = (
    "nvfp4",
)  # ModelOpt simulates NVFP4 (fake-quant forward) on CUDA only; calibration and export run anywhere


def sm_number(arch: str) -> int:
    """'sm90' -> 90, 'sm100a' -> 100."""
    return int("".join(c for c in arch[2:] if c.isdigit()))


def formats_for_sm(sm: int) -> list[str]:
    """The formats an SM number can run."""
    return [fmt for fmt, (_, need) in FORMATS.items() if sm >= need]


def arch_refusal(fmt: str, kv_cache: str, sm: int) -> str | None:
    """Why `sm` cannot run this format / KV-cache type ('format ... needs smN or newer'), or None."""
    if sm < FORMATS[fmt][1]:
        return f"format '{fmt}' needs sm{FORMATS[fmt][1]} or newer"
    if sm < KV_CACHE_TYPES[kv_cache]:
        return f"kv_cache '{kv_cache}' needs sm{KV_CACHE_TYPES[kv_cache]} or newer"
    return None


# engine (build.target) -> the formats it serves, whatever the TensorRT-LLM line (the line's own limits are
# facts/trtllm.py's quant_algos). Sources: engine, TensorRT-LLM's checkpoint QuantAlgo names
# (tests/contracts/trtllm_checkpoint.json); llmapi, the PyTorch backend's recipes in TensorRT-LLM's
# docs/source/features/quantization.md (FP4, FP8, FP8 KV, W4A16 / W4A8 AWQ and GPTQ; no INT8
# SmoothQuant); torch, LPX's reference engine runs ModelOpt's fake-quant forward of every format; vllm,
# vLLM's ModelOpt loader reads hf_quant_config.json for FP8 and NVFP4 only.
SERVABLE: dict[str, tuple[str, ...]] = {
    "engine": tuple(FORMATS),
    "llmapi": ("none", "fp8", "int4_awq", "w4a8_awq", "nvfp4"),
    "torch": tuple(FORMATS),
    "vllm": ("none", "fp8", "nvfp4"),
}
