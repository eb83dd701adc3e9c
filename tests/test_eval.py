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
    assert f"kl_mean {int4['kl_mean']:.4g} (allowed: quality_gate.max_kl 1e-06)" in msg
    assert "quality_gate.min_top1_agreement 0.999" in msg and "--skip-gate" in msg
    assert "bf16" not in msg.split("fix:")[0]

    table = io.StringIO()
    Console(file=table, width=200).print(eval_table(list(outcomes.values()), cfg))
    assert "FAIL" in table.getvalue() and "pass" in table.getvalue()

    # --skip-gate: built anyway, with a warning that names the failure; eval itself is cached
    out2 = io.StringIO()
    skipping = Runner(cfg, Reporter(Console(file=out2, width=200)), skip_gate=True)
    again = {o.variant: o for o in skipping.run(cfg.variants, "build")}
    assert "build:any" in again["int4"].artifacts
    log = out2.getvalue()
    assert "fails the quality gate" in log and "--skip-gate" in log
    assert "eval      int4/any                 cached" in log
    skipping.raise_gate_failures()  # nothing to raise


def test_gate_without_limits_passes_everything():
    from pipeline.config import QualityGate
    from pipeline.stages.evaluate import gate_failures

    r = {"kl_mean": 5.0, "top1_agreement": 0.1, "ppl_increase_pct": 300.0}
    assert gate_failures(r, QualityGate()) == []
    assert gate_failures(r, QualityGate(max_ppl_increase_pct=10)) == [
        "ppl_increase_pct 300 (allowed: quality_gate.max_ppl_increase_pct 10)"
    ]
    assert gate_failures({"skipped": "needs CUDA"}, QualityGate(max_kl=1)) == ["not evaluated (needs CUDA)"]
    assert gate_failures({"skipped": "needs CUDA"}, QualityGate()) == []
