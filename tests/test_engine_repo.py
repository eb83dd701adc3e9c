"""The engine target's Triton repository: the `tensorrt_llm` model against upstream's backend contract
(tests/contracts/tensorrtllm_backend_models.json), per targeted version, on an engine folder written by
the trtllm-build stand-in; and the cross-checks against the engine's config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from helpers_trtllm import DEMO_LIMITS, run_standin, write_checkpoint
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.config import parse_config
from pipeline.errors import LpxError
from pipeline.stages import repository as repo_stage
from pipeline.stages.repository import engine_repo

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = json.loads((ROOT / "tests/contracts/tensorrtllm_backend_models.json").read_text())
VERSIONS = {"1.2": "latest", "0.16": "v0.16.0"}


def make_cfg(version: str, **build):
    return parse_config(
        {
            "model": {"name": "tiny", "checkpoint": "/nonexistent"},
            "variants": [{"name": "fp8", "quantization": {"format": "fp8"}}],
            "build": {"target": "engine", "trtllm_version": version, **DEMO_LIMITS, **build},
        }
    )


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from pipeline.demo import _train_tokenizer, corpus_text, paragraphs

    d = tmp_path_factory.mktemp("state")
    _train_tokenizer(paragraphs(corpus_text()), vocab_size=512).save_pretrained(d)
    return d


def build_engine(
    tmp: Path, contract_version: str, paged_ctx: str = "enable", max_batch_size: int = 8
) -> Path:
    ckpt = write_checkpoint(tmp / "ckpt", "fp8")
    out = tmp / "engine"
    res = run_standin(
        [
            "trtllm-build",
            "--checkpoint_dir",
            str(ckpt),
            "--output_dir",
            str(out),
            "--max_batch_size",
            str(max_batch_size),
            "--use_paged_context_fmha",
            paged_ctx,
        ],
        contract_version,
        tmp,
    )
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module", params=sorted(VERSIONS))
def built(request, tmp_path_factory, tokenizer_dir):
    version = request.param
    tmp = tmp_path_factory.mktemp(f"engine_{version}")
    engine = build_engine(tmp, VERSIONS[version])
    dest = tmp / "repo"
    summary = repo_stage.write_repository(dest, engine, make_cfg(version), tokenizer_dir=tokenizer_dir)
    return version, dest, summary, engine


def parsed(dest: Path, model: str) -> mc.ModelConfig:
    return text_format.Parse((dest / model / "config.pbtxt").read_text(), mc.ModelConfig())


def upstream(version: str, model: str = "tensorrt_llm") -> dict:
    return CONTRACT["versions"][VERSIONS[version]]["models"][model]


def test_tensorrt_llm_model_matches_contract(built) -> None:
    version, dest, summary, _ = built
    conf, theirs = parsed(dest, "tensorrt_llm"), upstream(version)
    assert conf.backend == "tensorrtllm" == summary["backend"]
    assert conf.model_transaction_policy.decoupled is True
    assert conf.max_batch_size == DEMO_LIMITS["max_batch_size"]
    assert not (dest / "tensorrt_llm" / "1" / "model.py").exists()
    keys = set(conf.parameters)
    listed = {p["key"] for p in theirs["parameters"]}
    assert keys <= listed, f"not in backend {VERSIONS[version]}: {keys - listed}"
    by_var = {p["template_variable"]: p["key"] for p in theirs["parameters"] if p["template_variable"]}
    required = {by_var[v] for v in theirs["required_template_variables"] if v in by_var}
    assert required == {"gpt_model_type", "gpt_model_path"} and required <= keys
    for p in theirs["parameters"]:  # upstream's fixed values, where we write the key
        if p["template_variable"] is None and p["key"] in keys:
            assert conf.parameters[p["key"]].string_value == p["value"]
    params = {k: v.string_value for k, v in conf.parameters.items()}
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["batch_scheduler_policy"] in ("guaranteed_no_evict", "max_utilization")
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9" and params["max_beam_width"] == "1"
    assert all(not v.startswith("${") for v in params.values())
    for io, key in (("input", "inputs"), ("output", "outputs")):
        ours = {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in getattr(conf, io)}
        want = {
            t["name"]: (engine_repo.DATA_TYPES.get(t["data_type"][2:-1], t["data_type"]), t["dims"])
            for t in theirs[key]
        }
        assert ours == want
    opt = {t.name for t in conf.input if t.optional}
    assert opt == {t["name"] for t in theirs["inputs"] if t.get("optional")}
    ragged = {t.name for t in conf.input if t.allow_ragged_batch}
    assert ragged == {t["name"] for t in theirs["inputs"] if t.get("allow_ragged_batch")}
    assert list(conf.dynamic_batching.preferred_batch_size) == [DEMO_LIMITS["max_batch_size"]]


def test_engine_linked_and_path_absolute(built) -> None:
    _, dest, summary, engine = built
    conf = parsed(dest, "tensorrt_llm")
    path = Path(conf.parameters["gpt_model_path"].string_value)
    assert path.is_absolute() and path == (dest / "tensorrt_llm" / "1" / "engine").resolve()
    assert (path / "config.json").is_file() and (path / "rank0.engine").is_file()
    assert (path / "rank0.engine").stat().st_ino == (engine / "rank0.engine").stat().st_ino
    for model in ("preprocessing", "postprocessing"):
        assert (dest / model / "1" / "tokenizer" / "tokenizer.json").is_file()
        assert (dest / model / "1" / "model.py").is_file()
    assert summary["format"] == "FP8"


def test_ensemble_wiring_against_engine_model(built) -> None:
    version, dest, _, _ = built
    ens = parsed(dest, "ensemble")
    produced = {t.name: t.data_type for t in ens.input}
    up_steps = {s["model_name"]: s for s in upstream(version, "ensemble")["steps"]}
    for step in ens.ensemble_scheduling.step:
        conf = parsed(dest, step.model_name)
        inputs = {t.name: t for t in conf.input}
        assert {t.name for t in conf.input if not t.optional} <= set(step.input_map)
        if step.model_name == "tensorrt_llm":  # model-side names are upstream's, for this version
            assert set(step.input_map) <= set(up_steps["tensorrt_llm"]["input_map"])
        for model_input, tensor in step.input_map.items():
            assert tensor in produced and produced[tensor] == inputs[model_input].data_type, model_input
        outputs = {t.name: t.data_type for t in conf.output}
        produced.update({tensor: outputs[name] for name, tensor in step.output_map.items()})


def test_token_counts_only_where_the_engine_has_them(built) -> None:
    """num_output_tokens comes from tensorrt_llm in the ensemble: a v0.16 engine has none, so its ensemble
    offers neither the output nor return_num_output_tokens; the BLS model counts output_ids itself."""
    version, dest, _, _ = built
    engine_has = any(t["name"] == "num_output_tokens" for t in upstream(version)["outputs"])
    assert engine_has == (version == "1.2")
    ens = parsed(dest, "ensemble")
    assert ("num_output_tokens" in {t.name for t in ens.output}) == engine_has
    assert ("return_num_output_tokens" in {t.name for t in ens.input}) == engine_has
    ens_theirs = {t["name"] for t in upstream(version, "ensemble")["outputs"]}
    assert {t.name for t in ens.output} <= ens_theirs
    bls = parsed(dest, "tensorrt_llm_bls")
    assert bls.parameters["engine_counts_tokens"].string_value == str(engine_has).lower()
    assert "num_output_tokens" in {t.name for t in bls.output}


# -- cross-checks against the engine's config.json ------------------------------------------------
def test_max_batch_size_above_engine(tmp_path, tokenizer_dir) -> None:
    engine = build_engine(tmp_path, "latest", max_batch_size=4)
    with pytest.raises(LpxError, match=r"max_batch_size 8 .*max_batch_size 4"):
        repo_stage.write_repository(tmp_path / "r", engine, make_cfg("1.2"), tokenizer_dir=tokenizer_dir)


@pytest.mark.parametrize("knob", ["chunked", "policy"])
def test_paged_context_fmha_required(tmp_path, tokenizer_dir, monkeypatch, knob) -> None:
    engine = build_engine(tmp_path, "v0.16.0", paged_ctx="disable")
    cfg = make_cfg("0.16")
    repo_stage.write_repository(
        tmp_path / "ok", engine, cfg, tokenizer_dir=tokenizer_dir
    )  # defaults need none
    if knob == "chunked":
        monkeypatch.setattr(engine_repo, "ENABLE_CHUNKED_CONTEXT", True)
        kwargs, match = (
            {"chunked_context": True},
            r"enable_chunked_context true .*use_paged_context_fmha is False",
        )
    else:
        monkeypatch.setattr(engine_repo, "BATCH_SCHEDULER_POLICY", "max_utilization")
        kwargs, match = {"policy": "max_utilization"}, r"max_utilization .*use_paged_context_fmha is False"
    engine_cfg = engine_repo.read_engine_config(engine)
    with pytest.raises(LpxError, match=match):
        engine_repo.check_engine(engine_cfg, cfg, **kwargs)


def test_streaming_requires_decoupled(tmp_path) -> None:
    engine = engine_repo.read_engine_config(build_engine(tmp_path, "latest"))
    with pytest.raises(LpxError, match=r"streaming True .*decoupled is False"):
        engine_repo.check_engine(engine, make_cfg("1.2"), decoupled=False, streaming=True)
    engine_repo.check_engine(engine, make_cfg("1.2"), decoupled=False, streaming=False)


def test_engine_version_mismatch_and_missing_inputs(tmp_path, tokenizer_dir) -> None:
    engine = build_engine(tmp_path, "v0.16.0")
    with pytest.raises(LpxError, match=r"0\.16\.0 .*trtllm_version is 1\.2"):
        repo_stage.write_repository(tmp_path / "r", engine, make_cfg("1.2"), tokenizer_dir=tokenizer_dir)
    with pytest.raises(LpxError, match="tokenizer"):
        repo_stage.write_repository(tmp_path / "r", engine, make_cfg("0.16"))
    with pytest.raises(LpxError, match="No tokenizer files"):
        repo_stage.write_repository(tmp_path / "r", engine, make_cfg("0.16"), tokenizer_dir=tmp_path)
    with pytest.raises(LpxError, match="not a TensorRT-LLM engine folder"):
        repo_stage.write_repository(
            tmp_path / "r", tokenizer_dir, make_cfg("0.16"), tokenizer_dir=tokenizer_dir
        )


def test_parameters_never_outside_contract(monkeypatch) -> None:
    monkeypatch.setitem(engine_repo.PARAMETER_KEYS, "latest", frozenset({"gpt_model_type"}))
    with pytest.raises(LpxError, match="not in backend latest"):
        engine_repo.parameters(make_cfg("1.2"), Path("/x"))


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_parameter_key_table_is_the_contracts(version) -> None:
    assert engine_repo.PARAMETER_KEYS[VERSIONS[version]] == {
        p["key"] for p in upstream(version)["parameters"]
    }
