"""The torch target's fast path (issue 33): the restored ModelOpt model with its quantizers' work done
once at load where it can be, and in a few plain torch ops where it cannot, with the same numbers.

ModelOpt's live model fake-quantizes every weight at every forward (a 4-bit block quantizer or an FP8
cast over each weight matrix, per token step) and runs each activation quantizer through its generic
`TensorQuantizer.forward` (a custom op, then the eager FP8 cast on a CPU without ModelOpt's extension):
on SmolLM2-135M the fp8 variant decoded 15x slower than bf16. Here, per module:

  - QuantLinear: the weight quantizer is applied to the weight ONCE, exactly as the live path applies it
    at each forward (`weight_quantizer(weight)` on the stored bf16 weight, same call, same dtype), the
    result becomes the stored weight and the quantizer is disabled; the input quantizer becomes
    `fast_quantizer` (below); the module's forward becomes `F.linear(input_quantizer(x), W, b)`, what the
    live forward computes, minus ModelOpt's per-call bookkeeping. A weight shared with another module
    (lm_head tied to embed_tokens) is never written in place: the linear gets its own folded copy.
  - Quantized attention (KV-cache quantizers q/k/v_bmm_quantizer): each quantizer becomes
    `fast_quantizer`; with all of them disabled the attention runs its original transformers forward.
  - fast_quantizer: static per-tensor FP8 (E4M3) with the calibrated amax is ModelOpt's `_fp8_eager`
    with its scale computed once: scale = 448 / amax in float32, x -> (x.float() * scale).clamp(+-448)
    -> float8_e4m3fn -> float32 * (1 / scale) -> x's dtype, op for op; for a bfloat16 / float16 input
    that sequence is run once over all 65,536 values of the dtype and each call is a lookup in that
    table (the same result by construction, 3x faster at decode); a disabled quantizer is its
    pre-quant scale (AWQ's `x * pre_quant_scale`) or nothing.

Anything else (a quantizer kind not listed, a rotation, calibration mode, a dynamic amax) keeps
ModelOpt's live path for that module, and the summary says how many did.
tests/test_torch_fast.py holds the logits bit-identical (torch.equal) to the live model and to eval's
restore for fp8 (with FP8 KV cache), int4_awq and w4a8_awq, tied and untied.
"""

from __future__ import annotations

import os
import types

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max, as ModelOpt's _fp8_eager spells it
_EPS = 1.0 / (1 << 24)  # ModelOpt: an amax at or below this quantizes with scale 1


def enabled(fast: bool | None) -> bool:
    """The fast path is on unless `fast=False` or LPX_TORCH_FAST=0 (with `fast=None`)."""
    if fast is not None:
        return bool(fast)
    return os.environ.get("LPX_TORCH_FAST", "1").strip().lower() not in ("0", "false", "off", "no")


def _plain(q) -> bool:
    """No pre-processing fast_quantizer does not reproduce: rotation, bias, a backend, constant amax."""
    return not (
        q.rotate_is_enabled
        or q.rotate_back_is_enabled
        or getattr(q, "bias_calibrator", None) is not None
        or getattr(q, "backend", None) is not None
        or getattr(q, "_use_constant_amax", False)
    )


def _static_fp8(q) -> bool:
    amax = getattr(q, "_amax", None)
    return (
        q.fake_quant
        and q._if_quant
        and not q._if_calib
        and not getattr(q, "_dynamic", False)
        and q.num_bits == (4, 3)
        and q.block_sizes is None
        and q.axis is None
        and not q.is_mx_format
        and amax is not None
        and amax.numel() == 1
    )


def _fp8_qdq(x, scale, inv):
    """ModelOpt's _fp8_eager with its scale given: the op sequence every fast FP8 result comes from."""
    import torch

    dtype = x.dtype
    y = (x.to(torch.float32) * scale).clamp(min=-FP8_MAX, max=FP8_MAX)
    return (y.to(torch.float8_e4m3fn).to(torch.float32) * inv).to(dtype)


def _every_value(dtype):
    """All 65,536 values of a 16-bit float dtype, the one with bit pattern i at index i."""
    import torch

    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)


class _FP8Scale:
    """(scale, 1/scale) as float32 tensors, computed as _fp8_eager computes them from the current
    amax tensor, recomputed when that tensor is replaced (model.to(...) makes a new one); and, per
    16-bit input dtype, the quantize-dequantize of every value of that dtype (a 128-KiB table, shared
    through `shared` by the quantizers of one model whose scale is the same number)."""

    __slots__ = ("amax", "scale", "inv", "tables", "shared")

    def __init__(self, shared: dict | None = None) -> None:
        self.amax = None
        self.shared = {} if shared is None else shared

    def get(self, amax):
        import torch

        if amax is not self.amax:
            a = amax.to(torch.float32)
            safe = torch.where(a <= _EPS, torch.ones_like(a), a)
            scale = FP8_MAX / safe
            self.amax, self.scale, self.inv, self.tables = amax, scale, 1 / scale, {}
        return self.scale, self.inv

    def table(self, dtype):
        """The lookup table for `dtype` (bfloat16 / float16) at the scale get() last computed, or None
        for another dtype."""
        import torch

        table = self.tables.get(dtype)
        if table is None:
            if dtype not in (torch.bfloat16, torch.float16):
                return None
            key = (self.scale.item(), dtype)
            table = self.shared.get(key)
            if table is None:
                table = self.shared[key] = _fp8_qdq(_every_value(dtype), self.scale, self.inv)
            self.tables[dtype] = table
        return table


def fast_quantizer(q, tables: dict | None = None):
    """A plain-torch stand-in for TensorQuantizer `q` (same outputs), None for identity, or False when
    `q` is of a kind this module does not reproduce (then keep `q` itself). `tables`: lookup tables
    shared by the quantizers of one model (_FP8Scale)."""
    import torch

    if type(q).__name__ != "TensorQuantizer" or not _plain(q):
        return False
    has_pqs = q.pre_quant_scale is not None
    if q._disabled:
        if not has_pqs:
            return None

        def scaled(x):
            return x * q.pre_quant_scale

        return scaled
    if not _static_fp8(q):
        return False
    cache = _FP8Scale(tables)
    i16, i64 = torch.int16, torch.int64

    def fp8_quant(x):
        if x.numel() == 0:
            return x
        if has_pqs:
            x = x * q.pre_quant_scale
        scale, inv = cache.get(q._amax)
        table = cache.table(x.dtype)
        if table is not None:
            # A 16-bit input's result is its entry in the table _fp8_qdq computed over every value of
            # the dtype: equal by construction, one gather instead of six elementwise passes (3x
            # faster on a decode step's activations, where each op's dispatch is the cost). A negative
            # int16 index wraps to the table's upper half, where those bit patterns are.
            return table[x.view(i16).to(i64)]
        if not x.is_contiguous():
            x = x.contiguous()
        return _fp8_qdq(x, scale, inv)

    return fp8_quant


def _weight_foldable(wq) -> bool:
    """A weight quantizer whose output depends on the weight only: folding it once is exact."""
    subs = list(wq) if type(wq).__name__ == "SequentialQuantizer" else [wq]
    for q in subs:
        if not hasattr(q, "_disabled") or not _plain(q) or q.pre_quant_scale is not None:
            return False
        if not q._disabled and (not q.fake_quant or q._if_calib or not q._if_quant):
            return False
    return True


def _weight_active(wq) -> bool:
    subs = list(wq) if type(wq).__name__ == "SequentialQuantizer" else [wq]
    return any(not q._disabled for q in subs)


def _linear_forward(in_q):
    import torch.nn.functional as F

    if in_q is None:

        def forward(self, input):
            return F.linear(input, self._parameters["weight"], self._parameters["bias"])
    else:

        def forward(self, input):
            return F.linear(in_q(input), self._parameters["weight"], self._parameters["bias"])

    return forward


def _fold_linear(module, shared: set[int], stats: dict, tables: dict) -> bool:
    import torch

    wq, in_q, out_q = module.weight_quantizer, module.input_quantizer, module.output_quantizer
    fast_in = fast_quantizer(in_q, tables)
    if fast_in is False or fast_quantizer(out_q) is not None or not _weight_foldable(wq):
        return False
    weight = module._parameters["weight"]
    if _weight_active(wq):
        with torch.no_grad():
            folded = wq(weight)  # the live path's own call: weight_quantizer(weight), bf16 in, bf16 out
        assert folded.dtype == weight.dtype and folded.shape == weight.shape
        if weight.data_ptr() in shared:  # tied (lm_head = embed_tokens): never write into the embedding
            module._parameters["weight"] = torch.nn.Parameter(folded.contiguous(), requires_grad=False)
            stats["untied"] += 1
        else:
            with torch.no_grad():
                weight.copy_(folded)
        wq.disable()
        stats["folded"] += 1
    module.forward = types.MethodType(_linear_forward(fast_in), module)
    return True


def _fast_attention(module, stats: dict, tables: dict) -> bool:
    names = ("q_bmm_quantizer", "k_bmm_quantizer", "v_bmm_quantizer", "p_bmm_quantizer")
    quantizers = [getattr(module, n) for n in names]
    fast = [fast_quantizer(q, tables) for q in quantizers]
    if any(f is False for f in fast) or fast[3] is not None:
        return False
    if all(f is None for f in fast):  # no KV-cache quantization: transformers' own attention
        original = module.get_attn_type(module)
        module.forward = types.MethodType(original.forward, module)
        return True
    for q, f in zip(quantizers, fast, strict=True):
        if f is not None:
            q.forward = f
    stats["kv_quantizers"] += sum(f is not None for f in fast)
    return True


def apply(model) -> dict:
    """Fold and fast-path `model` (a restored ModelOpt model) in place; returns what was done."""
    import torch
    from modelopt.torch.quantization.nn.modules.quant_module import QuantLinearConvBase
    from modelopt.torch.quantization.plugins.huggingface import _QuantAttention

    stats = {"linears": 0, "folded": 0, "untied": 0, "attention": 0, "kv_quantizers": 0, "live": []}
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[p.data_ptr()] = counts.get(p.data_ptr(), 0) + 1
    shared = {ptr for ptr, n in counts.items() if n > 1}
    tables: dict = {}  # FP8 lookup tables by (scale, dtype), built at a quantizer's first call
    for name, module in model.named_modules():
        if isinstance(module, QuantLinearConvBase) and isinstance(module, torch.nn.Linear):
            if _fold_linear(module, shared, stats, tables):
                stats["linears"] += 1
            else:
                stats["live"].append(name)
        elif isinstance(module, _QuantAttention):
            if _fast_attention(module, stats, tables):
                stats["attention"] += 1
            else:
                stats["live"].append(name)
    return stats
