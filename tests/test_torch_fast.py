"""The torch target's fast path (torch_fast.py, issue 33): weights quantized once at load, activation and
KV-cache quantizers in plain torch, and the served model's numbers exactly the live ModelOpt model's and
eval's restore's - logits compared with torch.equal, greedy tokens with ==. Real ModelOpt on tiny seeded
Llamas (a tied-embedding one for every format, the demo's untied one for FP8); no timings here
(scripts/bench_torch.py measures the speed)."""

from __future__ import annotations

import pytest
from helpers_models import write_tiny_model
from rich.console import Console

from pipeline.config import parse_config
from pipeline.progress import Reporter
from pipeline.runner import Runner

pytestmark = pytest.mark.slow
FORMATS = {"fp8": "fp8", "int4_awq": "none", "w4a8_awq": "none"}  # format -> KV cache


@pytest.fixture(scope="module")
def tied_checkpoint(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("fast_tied") / "llama32", "llama-3.2-1b")


@pytest.fixture(scope="module")
def variants(tied_checkpoint, tmp_path_factory):
    """format -> (quantize artifact's state folder, torch engine folder), in one LPX home for the module."""
    import os

    home, before = tmp_path_factory.mktemp("fast_home"), os.environ.get("LPX_HOME")
    os.environ["LPX_HOME"] = str(home)
    out = {}
    try:
        for fmt, kv in FORMATS.items():
            cfg = parse_config(
                {
                    "model": {"name": "tied", "checkpoint": str(tied_checkpoint)},
                    "variants": [
                        {"name": fmt, "quantization": {"format": fmt, "kv_cache": kv, "awq_block_size": 16}}
                    ],
                    "calibration": {"samples": 2, "seq_len": 32, "batch_size": 2},
                    "build": {"archs": ["sm90"], "target": "torch", "max_input_len": 256, "max_seq_len": 512},
                }
            )
            runner = Runner(cfg, Reporter(Console(file=open(os.devnull, "w"))))
            art = runner.quantize(cfg.variants[0])
            out[fmt] = (art.path / "state", runner.build(cfg.variants[0], art, "any").path)
    finally:
        if before is None:
            os.environ.pop("LPX_HOME", None)
        else:
            os.environ["LPX_HOME"] = before
    return out


def weight_quantizers(model):
    from modelopt.torch.quantization.nn import TensorQuantizer

    return {
        n: q
        for n, q in model.named_modules()
        if n.endswith("weight_quantizer") or ".weight_quantizer." in n
        if isinstance(q, TensorQuantizer)
    }


def assert_same_numbers(a, b) -> None:
    """Logits of a batch of two prompts (padded, with a mask) and greedy decoding through the KV cache."""
    import torch

    ids = torch.arange(3, 43).reshape(2, 20)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        la = a(input_ids=ids, attention_mask=mask).logits
        lb = b(input_ids=ids, attention_mask=mask).logits
        assert la.dtype == lb.dtype == torch.bfloat16
        assert torch.equal(la, lb), f"logits differ by up to {(la.float() - lb.float()).abs().max()}"
        kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(a.generate(ids[:1], **kw), b.generate(ids[:1], **kw))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fast_model_is_the_live_model_and_evals_restore(variants, fmt):
    import torch

    from pipeline.runtime.engines.torch_engine import load_model
    from pipeline.stages.quantize.model_io import restore

    state, engine = variants[fmt]
    fast, live = load_model(engine), load_model(engine, fast=False)
    evaluated, _ = restore(state, "bfloat16", "cpu")
    assert not hasattr(live, "lpx_fast")
    stats = fast.lpx_fast
    assert stats["live"] == [], "every linear and attention is on the fast path"
    assert stats["linears"] == 2 * 7 + 1 and stats["folded"] == 2 * 7, (
        "all but lm_head carry a weight quantizer"
    )
    assert stats["kv_quantizers"] == (4 if FORMATS[fmt] == "fp8" else 0)  # k and v, per layer
    live_on = {n for n, q in weight_quantizers(live).items() if q.is_enabled}
    assert live_on and not {n for n, q in weight_quantizers(fast).items() if q.is_enabled}, (
        "the live model quantizes weights at every forward; the fast one folded them"
    )
    proj = "model.layers.0.mlp.down_proj"
    w_live, w_fast = live.get_submodule(proj), fast.get_submodule(proj)
    assert not torch.equal(w_live._parameters["weight"], w_fast._parameters["weight"]), (
        "the weight was folded"
    )
    with w_live.quantize_weight():
        assert torch.equal(w_live.weight, w_fast._parameters["weight"]), "folded = what the live forward uses"
    # tied embeddings: lm_head (no weight quantizer) still is the embedding, which folding left untouched
    assert fast.lm_head.weight.data_ptr() == fast.model.embed_tokens.weight.data_ptr()
    assert torch.equal(fast.model.embed_tokens.weight, live.model.embed_tokens.weight)
    assert_same_numbers(fast, live)
    assert_same_numbers(fast, evaluated)


def test_untied_fp8_engine_matches_live(torch_engine_dir):
    from pipeline.runtime.engines.torch_engine import load_model

    fast = load_model(torch_engine_dir)
    assert fast.lpx_fast["folded"] > 0 and fast.lpx_fast["live"] == []
    assert fast.lm_head.weight.data_ptr() != fast.model.embed_tokens.weight.data_ptr()
    assert_same_numbers(fast, load_model(torch_engine_dir, fast=False))


def test_a_quantized_tied_lm_head_gets_its_own_folded_weight(variants):
    """A config that quantizes lm_head (tied to embed_tokens) must not fold into the embedding."""
    import copy

    import torch

    from pipeline.runtime.engines import torch_fast
    from pipeline.runtime.engines.torch_engine import load_model

    _, engine = variants["fp8"]
    fast, live = load_model(engine, fast=False), load_model(engine, fast=False)
    for m in (
        fast,
        live,
    ):  # ModelOpt's FP8 weight quantizer of a layer, given lm_head with the embedding's amax
        q = copy.deepcopy(m.model.layers[0].mlp.up_proj.weight_quantizer)
        q.amax = m.model.embed_tokens.weight.detach().abs().amax().float()
        m.lm_head.weight_quantizer = q
    embedding = live.model.embed_tokens.weight.clone()
    stats = torch_fast.apply(fast)
    assert stats["untied"] == 1 and stats["folded"] == 2 * 7 + 1
    assert fast.lm_head.weight.data_ptr() != fast.model.embed_tokens.weight.data_ptr()
    assert torch.equal(fast.model.embed_tokens.weight, embedding), "the embedding is not the folded lm_head"
    assert not torch.equal(fast.lm_head.weight, embedding), "lm_head is quantized"
    assert_same_numbers(fast, live)


def test_fp8_quantizer_is_modelopts_bit_for_bit(variants):
    """fast_quantizer against the TensorQuantizer it replaces: values past amax, zeros, tiny values,
    a strided input, float32 and float16 input, an AWQ pre-quant scale, an amax below ModelOpt's
    epsilon, and every bfloat16 / float16 value (the domain of the fast path's lookup tables)."""
    import copy

    import torch

    from pipeline.runtime.engines import torch_fast
    from pipeline.runtime.engines.torch_engine import load_model

    live = load_model(variants["fp8"][1], fast=False)
    awq = load_model(variants["w4a8_awq"][1], fast=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 64, generator=g) * 4
    x[0, 0, :8] = torch.tensor([0.0, -0.0, 1e-9, -1e-9, 1e4, -1e4, 3.5, -3.5])
    cases = [
        live.model.layers[0].self_attn.q_proj.input_quantizer,
        live.model.layers[1].self_attn.k_bmm_quantizer,
    ]
    cases.append(awq.model.layers[0].mlp.gate_proj.input_quantizer)  # FP8 with pre_quant_scale
    tiny = copy.deepcopy(cases[0])
    tiny.amax = torch.tensor(1e-9)
    cases.append(tiny)
    for q in cases:
        f = torch_fast.fast_quantizer(q)
        assert callable(f)
        for inp in (x.bfloat16(), x, x.bfloat16().transpose(0, 1), x.half()):
            # x's dtype, or the promoted one of x * pre_quant_scale (float16 x, bfloat16 scale)
            dtype = inp.dtype if q.pre_quant_scale is None else (inp * q.pre_quant_scale).dtype
            assert torch.equal(f(inp), q(inp)) and f(inp).dtype == q(inp).dtype == dtype
        for dtype in (torch.bfloat16, torch.float16):  # the lookup tables' whole domain, NaN and inf too
            every = torch_fast._every_value(dtype)
            assert every.numel() == 65536 and every.view(torch.int16).unique().numel() == 65536
            every = every.reshape(-1, x.shape[-1])  # rows of the hidden size: a pre-quant scale applies
            got, want = f(every), q(every)
            assert got.dtype == want.dtype and torch.isinf(every).sum() == 2 and torch.isnan(want).any()
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    disabled = awq.model.layers[0].mlp.gate_proj.output_quantizer
    assert torch_fast.fast_quantizer(disabled) is None
    dynamic = copy.deepcopy(cases[0])
    del dynamic._amax  # a dynamic amax (per call): not reproduced, stays live
    assert torch_fast.fast_quantizer(dynamic) is False


def test_off_switches(variants, monkeypatch):
    from pipeline.runtime.engines import torch_fast
    from pipeline.runtime.engines.torch_engine import load_model

    engine = variants["int4_awq"][1]
    monkeypatch.setenv("LPX_TORCH_FAST", "0")
    assert not torch_fast.enabled(None) and torch_fast.enabled(True)
    assert not hasattr(load_model(engine), "lpx_fast")
    monkeypatch.delenv("LPX_TORCH_FAST")
    assert torch_fast.enabled(None) and not torch_fast.enabled(False)
    assert load_model(engine).lpx_fast["folded"] > 0
