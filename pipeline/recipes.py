"""Quantization recipes in ModelOpt's current form (an ordered list of quantizer entries),
and what each format needs from the GPU."""

from __future__ import annotations

import copy

from .config import Quantization
from .errors import PipelineError

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
            what = f"format '{q.format}'" if FORMATS[q.format][1] >= KV_MIN_SM[q.kv_cache] else f"kv_cache '{q.kv_cache}'"
            raise PipelineError(
                f"{where}: {what} needs sm{need} or newer, but build.archs lists {arch} - "
                f"drop {arch} from build.archs or choose another format for it",
                exit_code=2,
            )


def recipe(q: Quantization) -> dict | None:
    """The ModelOpt config for a variant, or None for `none` (no quantization)."""
    import modelopt.torch.quantization as mtq

    name = FORMATS[q.format][0]
    if name is None:
        if q.kv_cache != "none":
            raise PipelineError("quantization.kv_cache needs a quantized format; set format or kv_cache: none", 2)
        return None
    cfg = copy.deepcopy(getattr(mtq, name))
    entries = list(cfg["quant_cfg"])
    if q.format in ("int4_awq", "w4a8_awq"):
        for e in entries:
            c = e.get("cfg")
            if e.get("quantizer_name") == "*weight_quantizer":
                for item in c if isinstance(c, list) else [c]:
                    if isinstance(item, dict) and isinstance(item.get("block_sizes"), dict) and -1 in item["block_sizes"]:
                        item["block_sizes"][-1] = q.awq_block_size
    entries += copy.deepcopy(KV_ENTRIES.get(q.kv_cache, []))
    for pattern in q.exclude:
        entries.append({"quantizer_name": pattern if pattern.endswith("*") else pattern + "*", "enable": False})
    cfg["quant_cfg"] = entries
    return cfg
