"""lpx eval and the quality gate: measured against the unquantized model, enforced before build."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from pipeline.cli.stages import eval_table
from pipeline.config import parse_config
from pipeline.errors import LpxError
from pipeline.progress import Reporter
from pipeline.runner import Runner


def _cfg(ckpt, gate):
    return parse_config(
        {
            "model": {"name": "tiny", "checkpoint": str(ckpt)},
            "variants": [
                {"name": "bf16", "quantization": {"format": "none"}},
                {"name": "int4", "quantization": {"format": "int4_awq", "awq_block_size": 64}},
            ],
            "calibration": {"samples": 8, "seq_len": 64, "batch_size": 4},
            "evaluation": {"samples": 4, "seq_len": 64},
            "quality_gate": gate,
        }
    )


@pytest.mark.slow
def test_gate_blocks_the_failing_variant_only(tiny_checkpoint, isolated_home):
    out = io.StringIO()
    cfg = _cfg(tiny_checkpoint, {"max_kl": 1e-6, "min_top1_agreement": 0.999})
    runner = Runner(cfg, Reporter(Console(file=out, width=200)))
    outcomes = {o.variant: o for o in runner.run(cfg.variants, "build")}

    base = outcomes["bf16"].artifacts["eval"].manifest["results"]
    assert base["kl_mean"] == pytest.approx(0, abs=1e-9) and base["top1_agreement"] == 1.0
    assert base["ppl_quantized"] == pytest.approx(base["ppl_baseline"])
    int4 = json.loads((outcomes["int4"].artifacts["eval"].path / "manifest.json").read_text())["results"]
    assert int4["kl_mean"] > 1e-6 and int4["tokens"] > 50 and int4["data"]["source"] == "lpx:heldout.txt"

    assert "build:any" in outcomes["bf16"].artifacts
    assert "build:any" not in outcomes["int4"].artifacts, "a variant failing the gate must not be built"
    with pytest.raises(LpxError) as err:
        runner.raise_gate_failures()
    msg = err.value.message
    over = int4["kl_mean"] - 1e-6
    assert (
        f"kl_mean {int4['kl_mean']:.4g} is {over:.3g} above the limit quality_gate.max_kl 1e-06 (set in quality_gate)"
        in msg
    )
    assert "quality_gate.min_top1_agreement 0.999 (set in quality_gate)" in msg and "--skip-gate" in msg
    assert "bf16" not in msg.split("fix:")[0]

    table = io.StringIO()
    Console(file=table, width=200).print(eval_table(list(outcomes.values()), cfg))
    assert "FAIL" in table.getvalue() and "pass" in table.getvalue()
    caption = " ".join(table.getvalue().split())  # the caption wraps at the table's width
    assert (
        "gate: kl_mean <= 1e-06 (set), top1_agreement >= 0.999 (set), ppl_increase_pct <= 10% (default)"
        in caption
    )

    # --skip-gate: built anyway, with a warning that names the failure; eval itself is cached
    out2 = io.StringIO()
    skipping = Runner(cfg, Reporter(Console(file=out2, width=200)), skip_gate=True)
    again = {o.variant: o for o in skipping.run(cfg.variants, "build")}
    assert "build:any" in again["int4"].artifacts
    log = out2.getvalue()
    assert "fails the quality gate" in log and "--skip-gate" in log
    assert "eval      int4/any                 cached" in log
    skipping.raise_gate_failures()  # nothing to raise


OFF = {"max_kl": None, "min_top1_agreement": None, "max_ppl_increase_pct": None}


def test_the_default_gate_blocks_what_a_user_would_not_ship():
    """Without a quality_gate section the defaults apply (docs/quality.md); the message names the limit, its
    origin and the margin; null turns a limit off; only the config's own limits fail an unevaluated variant."""
    from pipeline.config import GATE_DEFAULTS, QualityGate
    from pipeline.stages.evaluate import gate_failures, gate_warnings

    default = QualityGate()
    assert default.model_dump() == GATE_DEFAULTS and default.active() and not default.explicit()
    # the real model's int4_awq figures (docs/results/real-model-2026-12-06.md) fail all three defaults
    r = {"kl_mean": 0.27, "top1_agreement": 0.68, "ppl_increase_pct": 21.8}
    assert gate_failures(r, default) == [
        "kl_mean 0.27 is 0.17 above the limit quality_gate.max_kl 0.1 (default)",
        "top1_agreement 0.68 is 0.12 below the limit quality_gate.min_top1_agreement 0.8 (default)",
        "ppl_increase_pct 21.8% is 11.8% above the limit quality_gate.max_ppl_increase_pct 10% (default)",
    ]
    # its fp8 figures pass them
    assert gate_failures({"kl_mean": 0.049, "top1_agreement": 0.87, "ppl_increase_pct": 4.4}, default) == []
    # on the limit passes; a loosened limit is named as the config's
    edge = {"kl_mean": 0.1, "top1_agreement": 0.8, "ppl_increase_pct": 10.0}
    assert gate_failures(edge, default) == []
    loose = QualityGate(max_ppl_increase_pct=25)
    assert loose.explicit()
    assert gate_failures(r, loose)[2:] == [] and "(default)" in gate_failures(r, loose)[0]
    assert gate_failures({**r, "ppl_increase_pct": 30.0}, loose)[-1] == (
        "ppl_increase_pct 30% is 5% above the limit quality_gate.max_ppl_increase_pct 25% (set in quality_gate)"
    )
    # null turns a limit off, all three null is no gate
    off = QualityGate(**OFF)
    assert not off.active() and not off.explicit() and gate_failures(r, off) == []
    only_kl = QualityGate(min_top1_agreement=None, max_ppl_increase_pct=None)
    assert [f.split()[0] for f in gate_failures(r, only_kl)] == ["kl_mean"]
    # a variant that could not be evaluated: a warning under the defaults, a failure under the config's limits
    skipped = {"skipped": "needs CUDA"}
    assert gate_failures(skipped, default) == [] and gate_warnings(skipped, default) == [
        "not evaluated, the default quality gate did not apply (needs CUDA)"
    ]
    assert gate_failures(skipped, QualityGate(max_kl=1)) == ["not evaluated (needs CUDA)"]
    assert gate_warnings(skipped, QualityGate(max_kl=1)) == [] and gate_warnings(skipped, off) == []
    assert gate_failures(skipped, off) == [] and gate_warnings(r, default) == []
