"""Quantization stage, every format: ModelOpt for real on the tiny checkpoint, exports checked
against the TensorRT-LLM checkpoint contract (tests/contracts/trtllm_checkpoint.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.config import Calibration, parse_config
from pipeline.errors import LpxError
from pipeline.facts.formats import FORMATS, KV_CACHES
from pipeline.facts.trtllm import LINES
from pipeline.progress import Reporter
from pipeline.runner import Runner
from pipeline.texts import load_texts

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "trtllm_checkpoint.json").read_text())
ALL = ["trtllm", "hf"]  # beside the torch target's state/: every export, for the contract checks
VARIANTS = [
    {"name": "bf16", "quantization": {"format": "none", "exports": ALL}},
    {"name": "fp8", "quantization": {"format": "fp8", "kv_cache": "fp8", "exports": ALL}},
    {"name": "int4_awq", "quantization": {"format": "int4_awq", "awq_block_size": 64, "exports": ALL}},
    {
        "name": "w4a8_awq",
        "quantization": {"format": "w4a8_awq", "awq_block_size": 32, "kv_cache": "fp8", "exports": ALL},
    },
    {"name": "int8_sq", "quantization": {"format": "int8_sq", "kv_cache": "int8", "exports": ALL}},
    {"name": "nvfp4", "quantization": {"format": "nvfp4", "kv_cache": "fp8", "exports": ALL}},
    {"name": "fp8_mlp_only", "quantization": {"format": "fp8", "exclude": ["*self_attn*"], "exports": ALL}},
]


def quiet() -> Reporter:
    return Reporter(Console(file=open("/dev/null", "w")))


@pytest.fixture(scope="module")
def quantized(tiny_checkpoint, tmp_path_factory):
    """Every variant quantized once (tp_size 2, so the rank split is exercised), keyed by name."""
    import os

    home = tmp_path_factory.mktemp("qhome")
    old = os.environ.get("LPX_HOME")
    os.environ["LPX_HOME"] = str(home)
    try:
        cfg = parse_config(
            {
                "model": {"name": "tiny", "checkpoint": str(tiny_checkpoint)},
                "variants": VARIANTS,
                "calibration": {"samples": 8, "seq_len": 64, "batch_size": 4},
                "build": {"archs": ["sm100"], "tp_size": 2},
            }
        )
        runner = Runner(cfg, quiet())
        yield {v.name: runner.quantize(v) for v in cfg.variants}
    finally:
        if old is None:
            os.environ.pop("LPX_HOME", None)
        else:
            os.environ["LPX_HOME"] = old


@pytest.mark.slow
@pytest.mark.parametrize("variant", [v["name"] for v in VARIANTS])
@pytest.mark.parametrize("version", ["latest", "v0.16.0"])
def test_trtllm_checkpoint_matches_contract(quantized, variant, version):
    art = quantized[variant]
    fmt = art.manifest["results"]["format"]
    kv = art.manifest["results"]["kv_cache"]
    line = "1.2" if version == "latest" else "0.16"
    if FORMATS[fmt].quant_algo and FORMATS[fmt].quant_algo not in LINES[line].quant_algos:
        pytest.skip(
            f"{fmt} is refused for TensorRT-LLM {line} before quantizing (test_capability_checks_refuse_before_work)"
        )
    cfg = json.loads((art.path / "trtllm" / "config.json").read_text())
    q = cfg["quantization"]
    fields = {
        f["key"]
        for f in CONTRACT["quantization"][f"fields_{version}" if version != "latest" else "fields_latest"]
    }
    assert set(q) <= fields, f"keys unknown to TensorRT-LLM {version}: {set(q) - fields}"
    allowed_algos = (
        CONTRACT["quantization"]["quant_algo_allowed_latest"]
        if version == "latest"
        else CONTRACT["QuantAlgo"]["v0.16.0_referenced_members"]
    )
    assert q.get("quant_algo") == FORMATS[fmt].quant_algo
    assert q.get("quant_algo") is None or q["quant_algo"] in allowed_algos
    assert q.get("kv_cache_quant_algo") == KV_CACHES[kv].quant_algo
    assert (
        q.get("kv_cache_quant_algo") is None
        or q["kv_cache_quant_algo"] in CONTRACT["quantization"]["kv_cache_quant_algo_allowed_latest"]
    )
    # the checkpoint is split for tp x pp: one rank file per rank, mapping consistent
    mapping = cfg["mapping"]
    assert mapping["world_size"] == mapping["tp_size"] * mapping["pp_size"] == 2
    assert sorted(p.name for p in (art.path / "trtllm").glob("rank*.safetensors")) == [
        "rank0.safetensors",
        "rank1.safetensors",
    ]
    assert cfg["architecture"] in CONTRACT["architectures"]["MODEL_MAP_keys_latest"]


@pytest.mark.slow
def test_manifest_records_recipe_and_provenance(quantized):
    m = json.loads((quantized["int4_awq"].path / "manifest.json").read_text())
    r = m["results"]
    entries = r["recipe"]["quant_cfg"]
    assert isinstance(entries, list) and all("quantizer_name" in e for e in entries)
    weight = next(e for e in entries if e["quantizer_name"] == "*weight_quantizer")
    assert weight["cfg"]["block_sizes"]["-1"] == 64  # awq_block_size reached ModelOpt
    assert r["calibration"]["source"] == "lpx:calibration.txt" and len(r["calibration"]["sha256"]) == 16
    assert {"torch", "transformers", "modelopt"} <= set(m["versions"])
    assert r["timings"]["calibrate_s"] > 0 and r["timings"]["export_trtllm_s"] > 0
    assert (quantized["int4_awq"].path / "hf" / "hf_quant_config.json").is_file()
    assert (quantized["int4_awq"].path / "hf" / "tokenizer.json").is_file()


@pytest.mark.slow
def test_calibrated_in_float32_on_a_cpu_exported_in_build_dtype(quantized):
    """calibration.dtype auto: a CPU calibrates in float32 (bf16 matmuls are 2-3x slower there), and every
    export is still build.dtype's (bfloat16): the high-precision weights of the HF and TensorRT-LLM
    checkpoints and the ModelOpt state's."""
    import torch
    from safetensors import safe_open

    from pipeline.config import Config
    from pipeline.stages.quantize.model_io import calibration_dtype

    for name in ("int4_awq", "fp8", "bf16"):
        folder = quantized[name].path
        calibration = json.loads((folder / "manifest.json").read_text())["results"]["calibration"]
        assert calibration["dtype"] == ("bfloat16" if name == "bf16" else "float32"), (name, calibration)
        for export in ("hf", "trtllm"):
            for file in (folder / export).glob("*.safetensors"):
                with safe_open(str(file), "pt") as f:
                    floats = {f.get_slice(k).get_dtype() for k in f.keys()} & {"F32", "BF16", "F16"}
                assert floats <= {"BF16", "F32"} and "BF16" in floats, (name, file, floats)
        for export in ("hf", "state"):
            config = json.loads((folder / export / "config.json").read_text())
            assert config.get("dtype", config.get("torch_dtype")) == "bfloat16", (name, export)
        state = torch.load(folder / "state" / "modelopt_state.pth", map_location="cpu", weights_only=False)
        weights = state["model_state_dict"]  # mto.save's layout: the state and the model's tensors
        dtypes = {v.dtype for k, v in weights.items() if torch.is_tensor(v) and k.endswith(".weight")}
        assert dtypes == {torch.bfloat16}, (name, dtypes)
    cfg = Config.model_validate({"model": {"name": "m", "checkpoint": "c"}, "variants": [{"name": "v"}]})
    assert calibration_dtype(cfg, "cpu") == "float32" and calibration_dtype(cfg, "cuda") == "bfloat16"
    cfg.calibration.dtype = "bfloat16"
    assert calibration_dtype(cfg, "cpu") == "bfloat16"


@pytest.mark.slow
def test_exclude_keeps_attention_in_high_precision(quantized):
    q = json.loads((quantized["fp8_mlp_only"].path / "trtllm" / "config.json").read_text())["quantization"]
    assert any("attention" in m for m in q["exclude_modules"])
    plain = json.loads((quantized["fp8"].path / "trtllm" / "config.json").read_text())["quantization"]
    assert not any("attention" in m for m in plain["exclude_modules"])


@pytest.mark.slow
def test_int8_kv_has_no_hf_export_and_says_why(quantized):
    r = quantized["int8_sq"].manifest["results"]
    assert r["exports"] == ["state", "trtllm"] and "INT8 KV" in r["notes"][0]


def _cfg(tiny_checkpoint, **over):
    data = {
        "model": {"name": "tiny", "checkpoint": str(tiny_checkpoint)},
        "variants": [{"name": "v", "quantization": {"format": "fp8"}}],
        "build": {"archs": ["sm90"]},
    }
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_config(data)


def test_capability_checks_refuse_before_work(tiny_checkpoint, isolated_home):
    cases = [
        (dict(variants=[{"name": "v", "quantization": {"format": "nvfp4"}}]), "needs sm100 or newer"),
        (
            dict(
                build={"archs": ["sm90"], "trtllm_version": "0.16"},
                variants=[{"name": "v", "quantization": {"format": "fp8", "kv_cache": "fp8"}}],
            ),
            None,
        ),
        (  # a TensorRT-LLM line binds the engine target (the torch target is LPX's own, bound by none)
            dict(
                build={"target": "engine", "archs": ["sm100"], "trtllm_version": "0.16"},
                variants=[{"name": "v", "quantization": {"format": "nvfp4"}}],
            ),
            "not known to TensorRT-LLM 0.16",
        ),
        (dict(build={"archs": ["sm90"], "tp_size": 3}), "does not divide the model's 4 attention heads"),
        (
            dict(
                build={"archs": ["sm90"], "tp_size": 2},
                variants=[{"name": "v", "quantization": {"format": "int4_awq", "awq_block_size": 128}}],
            ),
            "awq_block_size 128 does not divide hidden_size 128 / tp_size 2 = 64",
        ),
    ]
    for over, message in cases:
        runner = Runner(_cfg(tiny_checkpoint, **over), quiet())
        if message is None:
            runner.check(runner.cfg.variants[0])
            continue
        with pytest.raises(LpxError, match=message):
            runner.run(runner.cfg.variants, "quantize")
    assert not (isolated_home / "artifacts").exists(), "a refused variant must not start any work"


def test_calibration_sources(tmp_path):
    jsonl = tmp_path / "cal.jsonl"
    jsonl.write_text('{"prompt": "one two"}\n\n{"prompt": "three"}\n')
    got = load_texts(Calibration(data=jsonl, jsonl_field="prompt", samples=2))
    assert got.texts == ["one two", "three"] and got.source == str(jsonl)
    with pytest.raises(LpxError, match="line 1 is not a JSON object with a 'text' field"):
        load_texts(Calibration(data=jsonl, samples=1))
    txt = tmp_path / "cal.txt"
    txt.write_text("first paragraph\nstill first\n\nsecond\n")
    assert load_texts(Calibration(data=txt, samples=2)).texts == ["first paragraph\nstill first", "second"]
    with pytest.raises(LpxError, match="has 2 samples but calibration.samples asks for 5"):
        load_texts(Calibration(data=txt, samples=5))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(LpxError, match="holds no text samples"):
        load_texts(Calibration(data=tmp_path / "empty.txt"))
    with pytest.raises(LpxError, match="no file at"):
        load_texts(Calibration(data=tmp_path / "missing.txt"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(LpxError, match="is not UTF-8"):
        load_texts(Calibration(data=tmp_path / "latin1.txt", samples=1))
    builtin = load_texts(Calibration(samples=32))
    assert builtin.source == "lpx:calibration.txt" and len(builtin.texts) == 32
