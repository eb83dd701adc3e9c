"""Quantization recipes in ModelOpt's current form (an ordered list of quantizer entries),
and what each format needs from the GPU."""

from __future__ import annotations

import copy

from ...config import Quantization
from ...errors import PipelineError

# format -> (ModelOpt config name, minimum SM). Sources: ModelOpt's support matrix and
# TensorRT-LLM's precision docs (FP8 needs Ada/Hopper, NVFP4 Blackwell, INT4/INT8 Ampere+).
FORMATS = {
    "none": (None, 70),
    "fp8": ("FP8_DEFAULT_CFG", 89),
    "int4_awq": ("INT4_AWQ_CFG", 80),
    "w4a8_awq": ("W4A8_AWQ_BETA_CFG", 89),
    "int8_sq": ("INT8_SMOOTHQUANT_CFG", 80),
    "nvfp4": ("NVFP4_DEFAULT_CFG", 100),
}
KV_MIN_SM = {"none": 70, "fp8": 89, "int8": 80}
# What ModelOpt writes as quantization.quant_algo / kv_cache_quant_algo in the TensorRT-LLM checkpoint,
# and the TensorRT-LLM lines whose QuantAlgo knows it (tests/contracts/trtllm_checkpoint.json:
# QuantAlgo.values_latest and v0.16.0_referenced_members; NVFP4 post-dates v0.16.0).
QUANT_ALGO = {
    "none": None,
    "fp8": "FP8",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "nvfp4": "NVFP4",
}
KV_ALGO = {"none": None, "fp8": "FP8", "int8": "INT8"}
TRTLLM_SUPPORTS = {
    "1.2": {"FP8", "W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL", "NVFP4", "INT8"},
    "0.16": {"FP8", "W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL", "INT8"},
}
KV_ENTRIES = {
    "fp8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}}],
    "int8": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}],
}


def sm_number(arch: str) -> int:
    return int("".join(c for c in arch[2:] if c.isdigit()))


def check_archs(q: Quantization, archs: list[str], where: str) -> None:
    """Refuse a format (or KV-cache type) that one of the target architectures cannot run."""
    need = max(FORMATS[q.format][1], KV_MIN_SM[q.kv_cache])
    for arch in archs:
        if sm_number(arch) < need:
            what = (
                f"format '{q.format}'"
                if FORMATS[q.format][1] >= KV_MIN_SM[q.kv_cache]
                else f"kv_cache '{q.kv_cache}'"
            )
            raise PipelineError(
                f"{where}: {what} needs sm{need} or newer, but build.archs lists {arch} - "
                f"drop {arch} from build.archs or choose another format for it",
                exit_code=2,
            )


def check_trtllm(q: Quantization, version: str, where: str) -> None:
    """Refuse a format the targeted TensorRT-LLM line cannot load."""
    for algo, what in (
        (QUANT_ALGO[q.format], f"format '{q.format}'"),
        (KV_ALGO[q.kv_cache], f"kv_cache '{q.kv_cache}'"),
    ):
        if algo and algo not in TRTLLM_SUPPORTS[version]:
            raise PipelineError(
                f"{where}: {what} ({algo}) is not known to TensorRT-LLM {version} - "
                "set build.trtllm_version: 1.2 or choose another format",
                exit_code=2,
            )


def check_shapes(q: Quantization, config: dict, tp_size: int, where: str) -> None:
    """tp_size must split the attention heads; AWQ groups must fit each rank's slice of the weights."""
    heads = int(config.get("num_attention_heads", 0))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    if heads and heads % tp_size:
        raise PipelineError(
            f"build.tp_size {tp_size} does not divide the model's {heads} attention heads - "
            f"use a tp_size that divides {heads}",
            exit_code=2,
        )
    if kv_heads and kv_heads % tp_size and tp_size % kv_heads:
        raise PipelineError(
            f"build.tp_size {tp_size} cannot split the model's {kv_heads} key/value heads - "
            f"use a divisor or multiple of {kv_heads}",
            exit_code=2,
        )
    if q.format in ("int4_awq", "w4a8_awq"):
        for key in ("hidden_size", "intermediate_size"):
            dim = int(config.get(key, 0))
            if dim and (dim // tp_size) % q.awq_block_size:
                raise PipelineError(
                    f"{where}: awq_block_size {q.awq_block_size} does not divide {key} {dim} / tp_size {tp_size} "
                    f"= {dim // tp_size} - use a block size that divides it (64 or 32) or a smaller tp_size",
                    exit_code=2,
                )


def recipe(q: Quantization) -> dict | None:
    """The ModelOpt config for a variant, or None for `none` (no quantization)."""
    import modelopt.torch.quantization as mtq

    name = FORMATS[q.format][0]
    if name is None:
        if q.kv_cache != "none":
            raise PipelineError(
                "quantization.kv_cache needs a quantized format; set format or kv_cache: none", 2
            )
        return None
    cfg = copy.deepcopy(getattr(mtq, name))
    entries = list(cfg["quant_cfg"])
    if q.format in ("int4_awq", "w4a8_awq"):
        for e in entries:
            c = e.get("cfg")
            if e.get("quantizer_name") == "*weight_quantizer":
                for item in c if isinstance(c, list) else [c]:
                    if (
                        isinstance(item, dict)
                        and isinstance(item.get("block_sizes"), dict)
                        and -1 in item["block_sizes"]
                    ):
                        item["block_sizes"][-1] = q.awq_block_size
    entries += copy.deepcopy(KV_ENTRIES.get(q.kv_cache, []))
    for pattern in q.exclude:
        entries.append(
            {"quantizer_name": pattern if pattern.endswith("*") else pattern + "*", "enable": False}
        )
    cfg["quant_cfg"] = entries
    return cfg
