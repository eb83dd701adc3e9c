"""lpx compare on hand-written bench results.json files, and the bench roofline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.artifacts import Store
from pipeline.bench import report, roofline
from pipeline.bench.compare import compare, parse_variant
from pipeline.bench.roofline import roofline_inputs
from pipeline.cli.tools import compare as compare_command
from pipeline.errors import LpxError
from pipeline.facts.gpu import lookup_gpu


def stats(p50: float, p99: float) -> dict[str, float]:
    return {"mean": p50, "min": p50, "max": p99, "p50": p50, "p90": p99, "p99": p99}


def result(c: int, ttft: float, itl: float, tps: float) -> dict:
    return {
        "load": {"mode": "closed", "concurrency": c, "requests": 10},
        "requests": 10,
        "succeeded": 10,
        "failed": 0,
        "errors": [],
        "wall_s": 1.0,
        "token_source": "output_ids",
        "ttft_ms": stats(ttft, ttft * 2),
        "itl_ms": stats(itl, itl * 1.5),
        "e2e_ms": stats(ttft + 100 * itl, ttft + 150 * itl),
        "osl": stats(128, 128),
        "tokens_per_s_per_user": stats(1e3 / itl, 1e3 / itl),
        "output_tokens_per_s": tps,
        "requests_per_s": tps / 128,
        "slo_ms": {},
        "good_requests": None,
        "goodput_rps": None,
        "client_cpu_s": 0.1,
        "client_cpu_util": 0.1,
    }


def write_run(
    folder: Path, gpus=("NVIDIA H200",), levels=(1, 16), isl=128, protocol="grpc", itl=10.0, **extra
) -> Path:
    folder.mkdir(parents=True)
    doc = {
        "target": {
            "url": "127.0.0.1:8001",
            "model": "tensorrt_llm",
            "protocol": protocol,
            "input_len": isl,
            "output_len": 128,
            "vocab": [100, 30000],
            "seed": 0,
        },
        "results": [result(c, 20.0 + c, itl * (1 + c / 64), c * 1e3 / itl) for c in levels],
        "environment": {"gpus": list(gpus)},
        "finished_at": 0.0,
        **extra,
    }
    (folder / "results.json").write_text(json.dumps(doc))
    return folder


def manifest(
    store_root: Path, stage: str, kind: str, variant: str, key: str, results: dict, files: dict
) -> Path:
    folder = store_root / "artifacts" / kind / "m" / variant / "any" / key
    folder.mkdir(parents=True)
    for name, size in files.items():
        (folder / name).write_bytes(b"x" * size)
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "schema": 1,
                "stage": stage,
                "model": "m",
                "variant": variant,
                "arch": "any",
                "created": 1.0,
                "results": results,
                "key": key,
                "complete": True,
            }
        )
    )
    return folder


def test_side_by_side_with_quality_size_and_plot(tmp_path):
    a = write_run(tmp_path / "fp8", itl=8.0, variant={"model": "m", "name": "fp8"})
    b = write_run(tmp_path / "bf16", itl=12.0)
    store_root = tmp_path / "home"
    manifest(
        store_root,
        "eval",
        "evals",
        "fp8",
        "e1",
        {
            "kl_mean": 0.0123,
            "top1_agreement": 0.975,
            "ppl_baseline": 10.0,
            "ppl_quantized": 10.3,
            "ppl_increase_pct": 3.0,
        },
        {},
    )
    manifest(store_root, "quantize", "checkpoints", "fp8", "q1", {"format": "fp8"}, {"w.bin": 3000})
    out = compare([a, b], out=tmp_path / "cmp", store=Store(store_root))
    md = out["markdown"]
    assert "| fp8 | - | m/fp8 | - | KL 0.0123, top-1 97.5%, ppl 10.30 (+3.0%) | " in md
    assert "MB (checkpoint) | tensorrt_llm at 127.0.0.1:8001 |" in md
    assert out["facts"][0]["size_bytes"] > 3000  # file plus its manifest
    assert out["facts"][1] == {}  # names no variant: no quality, no size
    assert "| bf16 | - | c=16 | 10/0 |" in md and "| fp8 | - | c=1 | 10/0 | 21.0/42.0 |" in md
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000
    assert (tmp_path / "cmp" / "compare.md").read_text() == md


@pytest.mark.parametrize(
    "kwargs, field, values",
    [
        ({"gpus": ("NVIDIA H100 80GB HBM3",)}, "GPU differs", ("NVIDIA H200", "NVIDIA H100 80GB HBM3")),
        ({"isl": 512}, "input length differs", ("128", "512")),
        ({"protocol": "http"}, "protocol differs", ("grpc", "http")),
        ({"levels": (1, 64)}, "load levels differs", ("c=1, c=16", "c=1, c=64")),
    ],
)
def test_refuses_mixed_runs_naming_field_and_values(tmp_path, kwargs, field, values):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", **kwargs)
    with pytest.raises(LpxError, match=field) as err:
        compare([a, b], store=Store(tmp_path / "home"))
    assert all(v in str(err.value) for v in values) and "--force" in str(err.value)
    forced = compare([a, b], force=True, store=Store(tmp_path / "home"))
    assert field in forced["notes"][0] and "Forced past differences" in forced["markdown"]


def test_cli_and_bad_input(tmp_path):
    a = write_run(tmp_path / "a", label="first")
    res = CliRunner().invoke(compare_command, [str(a), str(a / "results.json"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "| first | - | c=1 |" in res.output and "compare.png" in res.output
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.json").write_text("{}")
    with pytest.raises(LpxError, match="not an 'lpx bench'"):
        compare([tmp_path / "junk"])
    assert parse_variant("m/fp8") == {"model": "m", "name": "fp8"} and parse_variant("fp8")["model"] is None


def test_artifact_field_sizes_that_folder(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "rank0.engine").write_bytes(b"x" * 5000)
    a = write_run(tmp_path / "a", variant={"model": None, "name": None, "artifact": str(engine)})
    f = compare([a], store=Store(tmp_path / "home"))["facts"][0]
    assert f["size_bytes"] == 5000 and f["size_of"] == "artifact"


CONFIG = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def test_roofline_ceiling_and_mbu(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(CONFIG))
    doc = json.loads((write_run(tmp_path / "a", itl=10.0) / "results.json").read_text())
    gpu = lookup_gpu("h200")
    info = roofline.roofline(doc, gpu, ckpt, "none", "bf16")
    shape = roofline.shape_of(ckpt)
    kv = 2 * 2 * 2 * 16 * 2  # K and V x layers x kv heads x head dim x bf16
    assert info["kv_bytes_per_token"] == kv and info["weight_bytes"] > 0 and shape.layers == 2
    r = doc["results"][1]  # c=16, mean ITL 10 * (1 + 16/64) = 12.5 ms
    step = info["weight_bytes"] + 16 * kv * (128 + 64)
    assert r["roofline"]["bytes_per_step"] == pytest.approx(step)
    assert r["roofline"]["ceiling_itl_ms"] == pytest.approx(step / 4.8e12 * 1e3)
    assert r["roofline"]["mbu"] == pytest.approx(step / 4.8e12 * 1e3 / 12.5)
    assert "Decode roofline on h200" in report.markdown(doc)


def test_roofline_inputs_from_options_or_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "home"))
    doc = {"environment": {"gpus": []}, "target": {}}
    assert "--gpu" in roofline_inputs(doc, checkpoint=tmp_path, format="fp8")
    g, ckpt, fmt, kv = roofline_inputs(
        {"environment": {"gpus": ["NVIDIA H200"]}}, checkpoint=tmp_path, format="fp8"
    )
    assert (g.key, ckpt, fmt, kv) == ("h200", tmp_path, "fp8", "bf16")
    q = manifest(
        tmp_path / "home", "quantize", "checkpoints", "fp8", "q1", {"format": "fp8", "kv_cache": "fp8"}, {}
    )
    doc = {"environment": {"gpus": []}, "variant": {"model": "m", "name": "fp8"}}
    g, ckpt, fmt, kv = roofline_inputs(doc, gpu="H100 SXM")
    assert (g.key, ckpt, fmt, kv) == ("h100-sxm", q, "fp8", "fp8")
