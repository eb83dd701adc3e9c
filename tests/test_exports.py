"""Exports follow the build target (issue 12): only what the target (and a quality gate, and
quantization.exports) needs is written, the cache key says which, the disk is checked before any work
and a disk that fills while writing is a clear error that leaves nothing complete-looking behind."""

from __future__ import annotations

import errno

import pytest
from rich.console import Console

from pipeline.config import parse_config
from pipeline.errors import ConfigError, LpxError
from pipeline.progress import Reporter
from pipeline.runner import Runner
from pipeline.stages import quantize as qstage
from pipeline.stages.quantize import model_io, resources

NO_GATE = {"max_kl": None, "min_top1_agreement": None, "max_ppl_increase_pct": None}


def runner(ckpt, target="engine", exports=(), gate=None, fmt="fp8"):
    cfg = parse_config(
        {
            "model": {"name": "tiny", "checkpoint": str(ckpt)},
            "variants": [{"name": "v", "quantization": {"format": fmt, "exports": list(exports)}}],
            "calibration": {"samples": 4, "seq_len": 32, "batch_size": 2},
            "quality_gate": NO_GATE if gate is None else gate,
            "build": {"archs": ["sm90"], "target": target, "max_input_len": 256, "max_seq_len": 512},
        }
    )
    return Runner(cfg, Reporter(Console(file=open("/dev/null", "w"))))


def exported(art) -> list[str]:
    return sorted(p.name for p in art.path.iterdir() if p.is_dir())


@pytest.mark.slow
def test_each_target_gets_only_its_export_and_the_key_says_which(tiny_checkpoint, isolated_home):
    arts = {}
    for target in ("engine", "llmapi", "torch"):
        r = runner(tiny_checkpoint, target)
        arts[target] = art = r.quantize(r.cfg.variants[0])
        assert (
            art.manifest["results"]["exports"]
            == {"engine": ["trtllm"], "llmapi": ["hf"], "torch": ["state"]}[target]
        )
        assert "tokenizer" in exported(art) and (art.path / "tokenizer" / "tokenizer.json").is_file()
        res = art.manifest["results"]
        (only,) = res["exports"]
        assert res["disk"]["written_bytes"][only] > 0 and res["disk"]["estimated_bytes"][only] > 0
        assert {"load", "calibrate"} <= set(res["host_peak_rss_gib"]) and res["timings"]["calibrate_s"] > 0
    assert len({a.key for a in arts.values()}) == 3
    # a quality gate needs the state lpx eval restores, the default gate too; asked-for exports are added
    gated = runner(tiny_checkpoint, "engine", gate={"max_kl": 1.0})
    assert qstage.needed_exports(gated.cfg, gated.cfg.variants[0]) == ("state", "trtllm")
    defaults = runner(tiny_checkpoint, "engine", gate={})
    assert qstage.needed_exports(defaults.cfg, defaults.cfg.variants[0]) == ("state", "trtllm")
    extra = runner(tiny_checkpoint, "engine", exports=["hf"])
    art = extra.quantize(extra.cfg.variants[0])
    assert art.manifest["results"]["exports"] == ["hf", "trtllm"]
    assert art.key not in {a.key for a in arts.values()}
    assert art.manifest["inputs"]["export"]["exports"] == ["hf", "trtllm"]
    # without a state/ export and with every limit null, eval says why it did not run
    ev = extra.evaluate(extra.cfg.variants[0], art)
    assert "no state/ export" in ev.manifest["results"]["skipped"]


@pytest.mark.slow
def test_a_build_whose_export_is_missing_is_refused(tiny_checkpoint, isolated_home):
    from pipeline.stages import build

    r = runner(tiny_checkpoint, "torch")
    art = r.quantize(r.cfg.variants[0])
    engine = runner(tiny_checkpoint, "engine")
    with pytest.raises(
        LpxError,
        match="has no trtllm/config.json .build.target engine reads it. - re-run 'lpx quantize'",
    ):
        build.run(engine.ctx, engine.cfg.variants[0], art, "sm90", isolated_home / "out")


def test_exports_are_validated():
    base = {"model": {"name": "m", "checkpoint": "."}}
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "variants": [{"name": "v", "quantization": {"exports": ["onnx"]}}]})
    assert "variants[0].quantization.exports[0]: must be one of trtllm, hf, state" in err.value.message
    with pytest.raises(ConfigError, match="lists an export twice"):
        parse_config({**base, "variants": [{"name": "v", "quantization": {"exports": ["hf", "hf"]}}]})


def test_estimate_follows_plan_weight_sizes(tiny_checkpoint):
    from pipeline.inspection.checkpoint import inspect_checkpoint
    from pipeline.inspection.plan import shape_from_config, weight_bytes

    info = inspect_checkpoint(tiny_checkpoint)
    shape = shape_from_config(info.config, "t")
    est = resources.estimate_bytes(info, "int4_awq", ("hf", "state", "trtllm"))
    assert (
        est["trtllm"] == est["hf"] == int(weight_bytes(shape, "int4_awq")["weight_bytes"] * 1.05) + (64 << 20)
    )
    assert est["state"] == int(weight_bytes(shape, "none")["weight_bytes"] * 1.05) + (64 << 20)


def test_a_disk_too_small_is_refused_before_any_work(tiny_checkpoint, isolated_home, monkeypatch):
    monkeypatch.setattr(resources, "free_bytes", lambda path: 100 << 20)  # 100 MiB free

    def no_load(*a, **k):
        raise AssertionError("the model must not be loaded when the disk cannot take the exports")

    monkeypatch.setattr(qstage, "load_model", no_load)
    r = runner(tiny_checkpoint, "torch", exports=["trtllm", "hf"])
    with pytest.raises(LpxError) as err:
        r.quantize(r.cfg.variants[0])
    msg = err.value.message
    assert "Not enough disk for variant 'v' of tiny" in msg and "0.10 GiB free" in msg
    assert "state 0.06 GiB" in msg and str(isolated_home / "artifacts" / "checkpoints") in msg
    assert "LPX_HOME" in msg
    slot = isolated_home / "artifacts" / "checkpoints" / "tiny" / "v" / "any"
    assert [p.name for p in slot.iterdir()] == [".lock"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 123456 vs 123400"),
    ],
)
def test_a_disk_that_fills_while_writing_leaves_nothing(tiny_checkpoint, isolated_home, monkeypatch, failure):
    real = model_io.export_trtllm

    def fill_up(cfg, info, model, out):
        real(cfg, info, model, out)  # half the work is on disk when the disk fills
        raise failure

    monkeypatch.setattr(qstage, "export_trtllm", fill_up)
    r = runner(tiny_checkpoint, "engine")
    with pytest.raises(LpxError) as err:
        r.quantize(r.cfg.variants[0])
    msg = err.value.message
    assert msg.startswith("The disk filled while writing the quantize exports into ") and "GiB free" in msg
    assert "nothing was kept" in msg
    slot = isolated_home / "artifacts" / "checkpoints" / "tiny" / "v" / "any"
    assert [p.name for p in slot.iterdir()] == [".lock"]


@pytest.mark.slow
def test_engine_target_runs_to_a_repository_without_state(tiny_checkpoint, isolated_home, monkeypatch):
    """trtllm/ alone (plus tokenizer/) carries the engine target through build and repo."""
    import sys
    from pathlib import Path

    standin = Path(__file__).parent / "standin_trtllm_build.py"
    monkeypatch.setenv("LPX_TRTLLM_BUILD", f"{sys.executable} {standin}")
    monkeypatch.delenv("STANDIN_FAIL", raising=False)
    r = runner(tiny_checkpoint, "engine")
    outcome = r.run(r.cfg.variants, "repo")[0]
    ck = outcome.artifacts["quantize"]
    assert exported(ck) == ["tokenizer", "trtllm"]
    repo = outcome.artifacts["repo:sm90"].path
    assert (repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json").is_file()
