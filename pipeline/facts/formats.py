"""The quantization formats and KV-cache types LPX offers, one record each (like `Line` in facts/trtllm.py):
what it quantizes and from which ModelOpt config, the name TensorRT-LLM gives it, where it runs (build
targets, GPU architectures, devices), and one `refusal()` that every caller asks "can this run here?".

Sources: ModelOpt's support matrix and TensorRT-LLM's precision docs (FP8 needs Ada/Hopper, NVFP4
Blackwell, INT4/INT8 Ampere+); the `quant_algo` names are what ModelOpt writes as
quantization.quant_algo / kv_cache_quant_algo in a TensorRT-LLM checkpoint
(tests/contracts/trtllm_checkpoint.json). Which TensorRT-LLM line knows which name is facts/trtllm.py's
`Line.quant_algos`. The targets: engine, TensorRT-LLM's checkpoint QuantAlgo names; llmapi, the PyTorch
backend's recipes in TensorRT-LLM's docs/source/features/quantization.md (FP4, FP8, FP8 KV, W4A16 / W4A8 AWQ
and GPTQ; no INT8 SmoothQuant); torch, LPX's reference engine runs ModelOpt's fake-quant forward of every
format; vllm, vLLM's ModelOpt loader reads hf_quant_config.json for FP8 and NVFP4 only, and its CPU platform
has no FP8 / NVFP4 linear kernels (docs/vllm.md).
"""

from __future__ import annotations

from dataclasses import dataclass

TARGETS = ("engine", "llmapi", "torch", "vllm")
LINE_TARGETS = ("engine", "llmapi")  # the targets whose TensorRT-LLM line limits what they load
HF_TARGETS = ("llmapi", "vllm")  # the targets that load ModelOpt's unified HF checkpoint (the `hf` export)


@dataclass(frozen=True)
class Format:
    name: str  # quantization.format
    modelopt_config: str | None  # the ModelOpt config the recipe starts from; None: not quantized
    quant_algo: str | None  # TensorRT-LLM's QuantAlgo for the weights
    min_sm: int  # the oldest GPU architecture that runs it
    targets: tuple[str, ...]  # the build targets that serve it (a TensorRT-LLM line may know fewer)
    awq: bool = False  # grouped 4-bit weights: quantization.awq_block_size applies
    # ModelOpt simulates its forward on CUDA only (calibration and export run anywhere)
    cuda_only: bool = False
    vllm_quantization: str | None = None  # vLLM's `quantization` method for its unified HF checkpoint
    vllm_cpu: bool = False  # vLLM's CPU platform has kernels for it


@dataclass(frozen=True)
class KvCache:
    name: str  # quantization.kv_cache
    quant_algo: str | None  # TensorRT-LLM's kv_cache_quant_algo
    min_sm: int
    hf_export: bool = True  # ModelOpt's unified HF checkpoint can hold it (0.47: FP8 and NVFP4, not INT8)


_NOT_VLLM = ("engine", "llmapi", "torch")
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("none", None, None, 70, TARGETS, vllm_cpu=True),
        Format("fp8", "FP8_DEFAULT_CFG", "FP8", 89, TARGETS, vllm_quantization="modelopt"),
        Format("int4_awq", "INT4_AWQ_CFG", "W4A16_AWQ", 80, _NOT_VLLM, awq=True),
        Format("w4a8_awq", "W4A8_AWQ_BETA_CFG", "W4A8_AWQ", 89, _NOT_VLLM, awq=True),
        Format("int8_sq", "INT8_SMOOTHQUANT_CFG", "W8A8_SQ_PER_CHANNEL", 80, ("engine", "torch")),
        Format(
            "nvfp4",
            "NVFP4_DEFAULT_CFG",
            "NVFP4",
            100,
            TARGETS,
            cuda_only=True,
            vllm_quantization="modelopt_fp4",
        ),
    )
}
KV_CACHES: dict[str, KvCache] = {
    k.name: k
    for k in (
        KvCache("none", None, 70),
        KvCache("fp8", "FP8", 89),
        KvCache("int8", "INT8", 80, hf_export=False),
    )
}


def sm_number(arch: str) -> int:
    """'sm90' -> 90, 'sm100a' -> 100."""
    return int("".join(c for c in arch[2:] if c.isdigit()))


def formats_for_sm(sm: int) -> list[str]:
    """The formats an SM number can run."""
    return [name for name, f in FORMATS.items() if sm >= f.min_sm]


def served(target: str, line: str | None = None) -> list[str]:
    """The formats `target` serves (for engine / llmapi: those TensorRT-LLM `line` knows, where given)."""
    from .trtllm import LINES

    known = LINES[line].quant_algos | {None} if line and target in LINE_TARGETS else None
    return [n for n, f in FORMATS.items() if target in f.targets and (known is None or f.quant_algo in known)]


def refusal(
    fmt: str,
    kv_cache: str = "none",
    *,
    target: str | None = None,
    line: str | None = None,
    sm: int | None = None,
    gpu: bool = True,
) -> str | None:
    """Why this format and KV-cache type cannot run where the keywords say, or None when they can. Asked
    by the config (so that `lpx config validate` refuses what no stage could run), the build stage, `lpx
    matrix`, `lpx compare`, the quantize, eval and torch stages.
    - always: a quantized KV cache needs a quantized format (ModelOpt's recipe is the format's);
    - `target` (with its TensorRT-LLM `line` for engine / llmapi): the target builds for the line and serves
      the format;
    - `sm`: the GPU architecture runs the format and the KV-cache type;
    - `gpu=False` with `target`: the target serves the format on a machine without a GPU.
    The reason names the fact ("format 'nvfp4' needs sm100 or newer"); callers add where it was asked."""
    f, kv = FORMATS[fmt], KV_CACHES[kv_cache]
    if kv.quant_algo and f.quant_algo is None:
        return "quantization.kv_cache needs a quantized format; set format or kv_cache: none"
    why = _target_refusal(f, kv, target, line) if target is not None else None
    if why is None and sm is not None:
        why = next(
            (
                f"{what} needs sm{need} or newer"
                for what, need in ((f"format '{fmt}'", f.min_sm), (f"kv_cache '{kv_cache}'", kv.min_sm))
                if sm < need
            ),
            None,
        )
    if why is None and not gpu and target is not None:
        why = _cpu_refusal(f, target)
    return why


def unknown_algo(fmt: str, kv_cache: str, line: str) -> str | None:
    """Why TensorRT-LLM `line`'s checkpoints cannot hold this format / KV-cache type, or None: asked by the
    build stage and `lpx matrix`, not by the config, so that the matrix lists such cells as excluded."""
    from .trtllm import LINES

    f, kv = FORMATS[fmt], KV_CACHES[kv_cache]
    for algo, what in ((f.quant_algo, f"format '{f.name}'"), (kv.quant_algo, f"kv_cache '{kv.name}'")):
        if algo and algo not in LINES[line].quant_algos:
            return f"{what} ({algo}) is not known to TensorRT-LLM {line}"
    return None


def _target_refusal(f: Format, kv: KvCache, target: str, line: str | None) -> str | None:
    from .trtllm import target_refusal

    if target in LINE_TARGETS and line is not None:
        why = target_refusal(target, line)
        if why:
            return why
    if target in HF_TARGETS and not kv.hf_export:
        ok = " or ".join(n for n, k in KV_CACHES.items() if k.hf_export)
        return (
            f"kv_cache '{kv.name}': ModelOpt's unified HF checkpoint, which build.target {target} loads, has no "
            f"{kv.quant_algo} KV cache - set quantization.kv_cache: {ok}, or build.target: engine"
        )
    if target in f.targets:
        return None
    where = (
        f"TensorRT-LLM {line} (build.target {target})" if target in LINE_TARGETS else f"build.target {target}"
    )
    return (
        f"{where} cannot serve format '{f.name}'; it serves {', '.join(served(target, line))} - choose one of "
        "them for quantization.format, or another build.target for this variant"
    )


def _cpu_refusal(f: Format, target: str) -> str | None:
    if target == "torch" and f.cuda_only:
        return f"format '{f.name}' is simulated by ModelOpt on CUDA only"
    if target == "vllm" and not f.vllm_cpu:
        return f"vLLM's CPU platform has no {f.name} kernels"
    return None
