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


# -- guided decoding: the xgrammar tokenizer info (tests/contracts/xgrammar_tokenizer_info.json) ------------
XGR_CONTRACT = json.loads((ROOT / "tests/contracts/xgrammar_tokenizer_info.json").read_text())
GUIDED_KEYS = {"guided_decoding_backend", "xgrammar_tokenizer_info_path"}


def tokenizer_copy(src: Path, dest: Path, **generation) -> Path:
    """A copy of the tokenizer folder, with a generation_config.json when `generation` is given."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    if generation:
        (dest / "generation_config.json").write_text(json.dumps(generation))
    return dest


def test_guided_decoding_parameters_for_latest_only(built) -> None:
    """latest: both parameters, the path absolute (as gpt_model_path) and naming the file LPX wrote beside
    the engine; v0.16.0's backend lists neither parameter: none written, no file."""
    version, dest, summary, _ = built
    params = {k: v.string_value for k, v in parsed(dest, "tensorrt_llm").parameters.items()}
    info = dest / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json"
    listed = {p["key"] for p in upstream(version)["parameters"]}
    if version == "1.2":
        assert GUIDED_KEYS <= listed
        assert params["guided_decoding_backend"] == "xgrammar"
        path = Path(params["xgrammar_tokenizer_info_path"])
        assert path.is_absolute() and path == info.resolve() and path.is_file()
        assert summary["guided_decoding"] == "xgrammar"
    else:
        assert not GUIDED_KEYS & listed
        assert not GUIDED_KEYS & set(params) and not info.exists()
        assert summary["guided_decoding"].startswith("off: ") and "0.16" in summary["guided_decoding"]


def test_tokenizer_info_matches_contract(built, tokenizer_dir) -> None:
    """The file has the contract's keys and types; entry i of encoded_vocab is token i as the tokenizer
    stores it, tokenizer_str is its tokenizer.json, stop ids its eos id (no generation_config.json here)."""
    from transformers import AutoTokenizer

    version, dest, _, _ = built
    if version != "1.2":
        pytest.skip("only the latest backend reads the file")
    raw = (dest / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").read_bytes()
    info = json.loads(raw.decode("utf-8"))
    keys = XGR_CONTRACT["format"]["keys"]
    assert set(info) == set(keys)
    assert isinstance(info["encoded_vocab"], list) and all(isinstance(t, str) for t in info["encoded_vocab"])
    assert isinstance(info["tokenizer_str"], str)
    assert info["stop_token_ids"] and all(type(i) is int for i in info["stop_token_ids"])
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert len(info["encoded_vocab"]) == len(tok)
    assert info["encoded_vocab"] == tok.convert_ids_to_tokens(list(range(len(tok))))
    assert json.loads(info["tokenizer_str"]) == json.loads(tok.backend_tokenizer.to_str())
    assert info["stop_token_ids"] == [tok.eos_token_id]


def test_tokenizer_info_round_trips_through_xgrammar(built, tokenizer_dir) -> None:
    """As upstream's C++ consumer builds it (guidedDecoder.cpp): metadata detected from tokenizer_str,
    TokenizerInfo(encoded_vocab, vocab_type, vocab size, stop ids, add_prefix_space). Its bytes per token
    rebuild the tokenizer's text, and a JSON-schema grammar compiled on it accepts the tokenizer's own
    ids of a valid answer, then ends on the stop id."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    version, dest, _, _ = built
    if version != "1.2":
        pytest.skip("only the latest backend reads the file")
    info = json.loads((dest / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").read_text("utf-8"))
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
    assert meta["vocab_type"] == xgr.VocabType.BYTE_LEVEL  # the demo tokenizer is byte-level BPE
    xinfo = xgr.TokenizerInfo(
        info["encoded_vocab"],
        meta["vocab_type"],
        vocab_size=len(tok),
        stop_token_ids=info["stop_token_ids"],
        add_prefix_space=meta["add_prefix_space"],
    )
    assert xinfo.stop_token_ids == info["stop_token_ids"]
    decoded = xinfo.decoded_vocab
    text = 'naïve {"city": "Zürich", "n": 42} 日本'
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(decoded[i] for i in ids) == text.encode("utf-8")
    special = set(tok.all_special_ids)
    for i in range(len(tok)):
        piece = tok.decode([i], clean_up_tokenization_spaces=False)
        if i not in special and "\ufffd" not in piece:  # whole characters: bytes equal the text's
            assert decoded[i] == piece.encode("utf-8"), i
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    compiled = xgr.GrammarCompiler(xinfo).compile_json_schema(json.dumps(schema), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    for i in tok.encode('{"n": 42}', add_special_tokens=False):
        assert matcher.accept_token(i), tok.convert_ids_to_tokens(i)
    assert not matcher.accept_token(tok.encode("x", add_special_tokens=False)[0])
    assert matcher.accept_token(info["stop_token_ids"][0]) and matcher.is_terminated()


def test_stop_ids_are_the_checkpoints_eos_ids(tmp_path, tokenizer_dir) -> None:
    """generation_config.json's eos ids (an int or a list), then the tokenizer's: the ids preprocessing
    ends requests on."""
    from transformers import AutoTokenizer

    from pipeline.runtime.model_args import end_ids
    from pipeline.stages.repository import xgrammar_info

    eos = AutoTokenizer.from_pretrained(tokenizer_dir).eos_token_id
    folder = tokenizer_copy(tokenizer_dir, tmp_path / "tok", eos_token_id=[7, eos, 9])
    info = json.loads(xgrammar_info.text(folder))
    assert info["stop_token_ids"] == [7, eos, 9]
    assert info["stop_token_ids"] == end_ids(folder, AutoTokenizer.from_pretrained(folder))


def test_gateway_takes_guides_for_lpx_repository_only(built, tmp_path, tokenizer_dir) -> None:
    """The gateway's engine_values on the repository's own tensorrt_llm config: an LPX `latest`
    repository takes guides; v0.16.0 and a repository without the parameters (a tokenizer with no eos
    id: LPX leaves guided decoding off and says why) are a 400 naming the fix."""
    from transformers import AutoTokenizer

    from pipeline.gateway.errors import ApiError
    from pipeline.gateway.structured import Guide, engine_values
    from pipeline.gateway.triton import ModelInfo

    def model_info(dest: Path) -> ModelInfo:
        conf = parsed(dest, "tensorrt_llm")
        return ModelInfo(
            {t.name: mc.DataType.Name(t.data_type)[5:] for t in conf.input},
            {t.name for t in conf.output},
            params={"tensorrt_llm": {k: v.string_value for k, v in conf.parameters.items()}},
            backend=conf.backend,
        )

    guide = Guide("json_schema", '{"type":"object"}', "response_format.json_schema.schema")
    version, dest, _, engine = built
    if version == "1.2":
        assert engine_values(guide, model_info(dest)) == guide.values()
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        tok.eos_token = None
        tok.save_pretrained(tmp_path / "no_eos")
        summary = repo_stage.write_repository(
            tmp_path / "r", engine, make_cfg("1.2"), tokenizer_dir=tmp_path / "no_eos"
        )
        assert summary["guided_decoding"].startswith("off: ") and "eos_token_id" in summary["guided_decoding"]
        assert not GUIDED_KEYS & set(parsed(tmp_path / "r", "tensorrt_llm").parameters)
        with pytest.raises(ApiError, match="guided_decoding_backend parameter to xgrammar"):
            engine_values(guide, model_info(tmp_path / "r"))
    else:
        with pytest.raises(ApiError, match="TensorRT-LLM 0.16"):
            engine_values(guide, model_info(dest))


def test_repository_key_follows_the_tokenizer_info(tmp_path, tokenizer_dir) -> None:
    """The stage's key holds the sha256 of the tokenizer info it writes: a changed tokenizer (here its
    eos ids) changes the key; the config.pbtxt in the key has a placeholder path."""
    import hashlib

    from pipeline.artifacts import Artifact, Store
    from pipeline.cache_keys import make_key
    from pipeline.progress import Reporter
    from pipeline.stages.context import Context

    cfg = make_cfg("1.2")
    engine = Artifact(build_engine(tmp_path, "latest"), {"key": "e" * 16, "stage": "build"})
    ckpt = tmp_path / "quantized"
    tokenizer_copy(tokenizer_dir, ckpt / "tokenizer")
    checkpoint = Artifact(ckpt, {"key": "q" * 16, "stage": "quantize"})
    ctx = Context(cfg, Reporter(), Store(tmp_path / "home"))
    first = repo_stage.inputs(ctx, cfg.variants[0], engine, checkpoint)
    assert (
        '"<repository>/tensorrt_llm/1/xgrammar_tokenizer_info.json"' in first["config.pbtxt"]["tensorrt_llm"]
    )
    repo_stage.run(ctx, cfg.variants[0], engine, checkpoint, tmp_path / "out")
    written = (tmp_path / "out" / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").read_bytes()
    assert first["xgrammar_tokenizer_info"] == hashlib.sha256(written).hexdigest()
    assert make_key(repo_stage.inputs(ctx, cfg.variants[0], engine, checkpoint)) == make_key(first)
    (ckpt / "tokenizer" / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 4]}))
    second = repo_stage.inputs(ctx, cfg.variants[0], engine, checkpoint)
    assert second["xgrammar_tokenizer_info"] != first["xgrammar_tokenizer_info"]
    assert make_key(second) != make_key(first)
