"""Engines compared: variants of one config that differ only by build target share one quantize artifact
(and its eval), `lpx compare` shows the target of each run, and a target that cannot serve here keeps its
line with the reason (`lpx compare -c`, `lpx tune`'s pruning). In process: the stages run for real on a
tiny Qwen2.5-shaped checkpoint; nothing is served (the measured runs of docs/compare.md cost minutes)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers_models import write_tiny_model
from rich.console import Console

from pipeline.artifacts import Store
from pipeline.bench.compare import compare_docs, target_of
from pipeline.bench.engines import not_run, where_not
from pipeline.cli.tools import compare as compare_command
from pipeline.config import parse_config
from pipeline.config.tune import Tune
from pipeline.demo import demo_config_dict
from pipeline.errors import UsageError
from pipeline.facts.gpu import GpuInfo
from pipeline.progress import Reporter
from pipeline.runner import Runner
from pipeline.stages.quantize import needed_exports
from pipeline.tune import answer, report, space
from pipeline.tune.run import prune_elsewhere

TARGETS = ("torch", "vllm", "llmapi", "engine")


def config_dict(checkpoint) -> dict:
    """The demo's config with one variant per target, all format none, and an fp8 variant on torch."""
    data = demo_config_dict(str(checkpoint))
    data["model"]["name"] = "tiny-qwen"
    data["variants"] = [
        {"name": t, "quantization": {"format": "none"}, "build": {"target": t}} for t in TARGETS
    ]
    data["variants"].append({"name": "fp8", "quantization": {"format": "fp8"}})  # not run: its exports only
    return data


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """Every variant quantized and evaluated once, through the runner, in the module's own LPX_HOME."""
    root = tmp_path_factory.mktemp("engines")
    ckpt = write_tiny_model(root / "qwen", "qwen2.5-0.5b")
    data = config_dict(ckpt)
    (root / "lpx.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = parse_config(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
        runner = Runner(cfg, Reporter(Console(file=open(os.devnull, "w"))))
        outcomes = runner.run([cfg.variant(t) for t in TARGETS], "eval")
    return cfg, {o.variant: o.artifacts for o in outcomes}, root


def test_variants_that_differ_by_target_share_one_quantize_artifact_and_its_eval(staged):
    cfg, arts, _ = staged
    q = {name: a["quantize"] for name, a in arts.items()}
    assert {q[t].key for t in TARGETS} == {q["torch"].key}
    # one quantization, the exports of every target built from it: state (torch), hf (vllm, llmapi), trtllm
    assert sorted(q["torch"].manifest["results"]["exports"]) == ["hf", "state", "trtllm"]
    fp8 = cfg.variant("fp8")  # another quantization on torch: only its own target's export
    assert needed_exports(cfg.for_variant(fp8), fp8) == ("state",)
    first = next(t for t in TARGETS if "shared_from" not in q[t].manifest)  # the one that quantized
    for t in TARGETS:
        assert q[t].path.parent.parent.name == t and q[t].manifest["variant"] == t  # each slot holds its own
        if t != first:
            source = Path(q[t].manifest["shared_from"])
            assert source.name == q[t].key and source.parent.parent.name in set(TARGETS) - {t}
        for f in ("state/modelopt_state.pth", "hf/config.json"):
            a, b = (q[first].path / f).stat(), (q[t].path / f).stat()
            assert (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)  # hard links: the bytes are on disk once
    ev = {t: arts[t]["eval"] for t in TARGETS}
    assert (
        len({e.key for e in ev.values()}) == 1
        and len({json.dumps(e.manifest["results"]) for e in ev.values()}) == 1
    )
    assert ev["vllm"].manifest["results"]["kl_mean"] == pytest.approx(0.0, abs=1e-3)  # bf16 against bf16


def test_where_not_names_what_each_target_needs(staged, monkeypatch, tmp_path):
    cfg, _, _ = staged
    v = {x.name: x for x in cfg.variants}
    monkeypatch.delenv("LPX_TRITON_PYTHONPATH", raising=False)
    monkeypatch.setenv("LPX_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    assert "LPX_VLLM_PYTHON" in where_not(cfg, v["vllm"], gpu=None)
    monkeypatch.setenv("LPX_VLLM_PYTHON", sys.executable)
    assert where_not(cfg, v["torch"], gpu=None) is None and where_not(cfg, v["vllm"], gpu=None) is None
    for t in ("llmapi", "engine"):
        why = where_not(cfg, v[t], gpu=None)
        assert f"target {t} serves on TensorRT-LLM" in why and "no NVIDIA GPU and no tensorrt_llm" in why
    fp8_vllm = v["vllm"].model_copy(update={"quantization": v["fp8"].quantization})
    assert "no fp8 kernels" in where_not(cfg, fp8_vllm, gpu=None)
    a100, h200 = GpuInfo("NVIDIA A100", 81920, 0, "8.0"), GpuInfo("NVIDIA H200", 143771, 0, "9.0")
    assert (
        where_not(cfg, fp8_vllm, gpu=a100)
        == "format 'fp8' needs sm89 or newer, and this GPU is NVIDIA A100 (sm80)"
    )
    assert where_not(cfg, fp8_vllm, gpu=h200) is None
    assert where_not(cfg, v["llmapi"], gpu=h200).endswith("this machine has no tensorrt_llm")
    standin = os.path.join(os.path.dirname(__file__), "standin_tensorrt_llm")
    monkeypatch.setenv("LPX_TRITON_PYTHONPATH", standin)  # a TensorRT-LLM the Triton stub would import
    assert where_not(cfg, v["llmapi"], gpu=h200) is None


def test_compare_keeps_a_target_that_cannot_run_here_with_its_quality_size_and_reason(staged, monkeypatch):
    cfg, arts, root = staged
    monkeypatch.setenv("LPX_HOME", str(root / "home"))
    why = where_not(cfg, cfg.variant("llmapi"), gpu=None)
    record = not_run(cfg, cfg.variant("llmapi"), why, Reporter(Console(file=open(os.devnull, "w"))))
    assert record["variant"]["artifact_keys"]["quantize"] == arts["torch"]["quantize"].key
    assert os.path.isdir(record["variant"]["artifact"])  # the llmapi build runs anywhere: its size is known
    measured = run_doc(cfg, arts["torch"]["quantize"])
    out = compare_docs([measured, record], store=Store(root / "home"))
    md = out["markdown"]
    key = arts["torch"]["quantize"].key
    assert f"| torch | torch | tiny-qwen/torch | {key} | KL 0.0000, top-1 100.0%" in md
    assert f"| llmapi | llmapi | tiny-qwen/llmapi | {key} | KL 0.0000, top-1 100.0%" in md
    assert f"MB (artifact) | not run here: {why} |" in md
    assert (
        "| torch | torch | c=1 | 8/0 | 20.0/40.0 | 5.0/7.5 | 180.0 |" in md
        and "| llmapi | llmapi | c=" not in md
    )
    assert out["facts"][1]["size_bytes"] > 0 and out["facts"][1]["size_of"] == "artifact"


def run_doc(cfg, quantized) -> dict:
    """A measured run of the torch variant as `lpx bench -c` records it (its figures hand-written)."""
    s = lambda p50, p99: {"mean": p50, "min": p50, "max": p99, "p50": p50, "p90": p99, "p99": p99}  # noqa: E731
    level = {
        "load": {"mode": "closed", "concurrency": 1, "requests": 8},
        "succeeded": 8,
        "failed": 0,
        "ttft_ms": s(20.0, 40.0),
        "itl_ms": s(5.0, 7.5),
        "tokens_per_s_per_user": s(200.0, 200.0),
        "output_tokens_per_s": 180.0,
    }
    return {
        "_path": "torch",
        "target": {
            "url": "127.0.0.1:1",
            "model": "tensorrt_llm",
            "protocol": "grpc",
            "input_len": 128,
            "output_len": 64,
        },
        "results": [level],
        "environment": {"gpus": []},
        "label": "torch",
        "variant": {
            "model": cfg.model.name,
            "name": "torch",
            "target": "torch",
            "artifact_keys": {"quantize": quantized.key},
        },
    }


def test_compare_c_without_a_runnable_target_and_bad_input(staged, monkeypatch):
    cfg, arts, root = staged
    monkeypatch.setenv("LPX_HOME", str(root / "home"))
    monkeypatch.delenv("LPX_TRITON_PYTHONPATH", raising=False)
    args = ["-c", str(root / "lpx.yaml"), "--variant", "llmapi", "--variant", "engine"]
    res = CliRunner().invoke(compare_command, args)
    assert res.exit_code == 0, res.output
    assert res.output.count("not run here: target ") == 2 and "No run was measured here" in res.output
    assert res.output.count(f"| {arts['torch']['quantize'].key} |") == 2  # the same quantized model
    for bad, message in (
        ([str(root), "-c", str(root / "lpx.yaml")], "give RUN_DIRs or -c/--variant, not both"),
        ([], "give RUN_DIRs (folders from 'lpx bench --out'), or -c lpx.yaml"),
        (["-c", str(root / "lpx.yaml"), "--variant", "nope"], "No variant 'nope' in the config"),
    ):
        res = CliRunner().invoke(compare_command, bad)
        assert isinstance(res.exception, UsageError) and message in res.exception.message, res.output


def test_tune_cells_carry_their_target_and_those_that_cannot_run_are_pruned_with_the_reason(
    staged, monkeypatch
):
    cfg, _, _ = staged
    monkeypatch.setenv("LPX_VLLM_PYTHON", sys.executable)
    monkeypatch.delenv("LPX_TRITON_PYTHONPATH", raising=False)
    monkeypatch.setattr("pipeline.facts.gpu.detect_gpu", lambda: None)
    tune = Tune(input_len=32, output_len=16, grid={"max_batch_size": [2], "max_num_tokens": [256]})
    cells = space.cells(cfg, tune, None, {}, ["torch", "vllm", "llmapi"])
    prune_elsewhere(cfg, cells)
    assert [(c.variant, c.target) for c in cells] == [
        ("torch", "torch"),
        ("vllm", "vllm"),
        ("llmapi", "llmapi"),
    ]
    assert cells[0].pruned is None and cells[1].pruned is None
    assert cells[2].pruned.startswith("target llmapi not run here: target llmapi serves on TensorRT-LLM")
    assert (
        space.cell_config(cfg, cfg.variant("vllm"), cells[1].limits).variants == cfg.variants
    )  # siblings kept
    doc = {
        "cell": cells[1].as_dict(),
        "slo": {"ttft=100ms": {"goodput_rps": 2.0, "knee_concurrency": 4, "best_rate": {"load": 2.5}}},
        "memory": {"kind": "host", "gib": 1.5},
        "size_bytes": 2_500_000,
    }
    row = answer.row(doc, "ttft=100ms", {"kl_mean": 0.0, "top1_agreement": 1.0})
    assert (row["target"], row["size_bytes"]) == ("vllm", 2_500_000)
    md = report.markdown(
        {
            "model": "m",
            "measurement": {"input_len": 32, "output_len": 16, "requests": 8, "search": {"attainment": 0.9}},
            "environment": {"gpus": [], "host": "h"},
            "slos": {"ttft=100ms": {"rows": [row], "front": [], "best": None}},
            "pruned": [{"cell": cells[2].name, "reason": cells[2].pruned}],
        }
    )
    assert "| vllm b2 t256 | vllm | 2 | 4 | 2.5 |" in md and "| 2.5 | 0.0000 |" in md
    assert f"- llmapi b2 t256: {cells[2].pruned}" in md


def test_a_bench_run_names_its_target_or_the_config_it_recorded_does():
    config = {"build": {"target": "torch"}, "variants": [{"name": "a", "build": {"target": None}}]}
    config["variants"].append({"name": "b", "build": {"target": "vllm"}})
    runs = [{"variant": {"name": n, "config": config}} for n in ("a", "b")]
    runs.append({"variant": {"name": "c", "target": "llmapi"}})  # recorded by lpx bench -c
    runs.append({"variant": {"name": "d", "config": config}})  # not in the config it recorded
    assert [target_of(r) for r in runs] == ["torch", "vllm", "llmapi", None]
