"""The Triton model repository: valid ModelConfig protobufs, upstream's tensor contract, relocatable
layout, and streaming detokenization that never breaks a character or a space (no server needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from helpers_models import load_model_module
from tritonclient.grpc import model_config_pb2 as mc

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.errors import LpxError
from pipeline.runtime.tensors import DEFAULT_DTYPES, LPX_TRTLLM, VALIDATED_INPUTS
from pipeline.stages import repository as repo_stage
from pipeline.stages.repository.model_configs import MODELS

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "tests/contracts/tensorrtllm_backend_models.json"
TEXT = "Hello world, the river ran. 中文 😀 naïve café - done"


@pytest.fixture(scope="module")
def demo_tokenizer():
    from pipeline.demo import _train_tokenizer, corpus_text, paragraphs

    return _train_tokenizer(paragraphs(corpus_text()), vocab_size=512)


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory, demo_tokenizer) -> Path:
    """A stand-in torch engine dir: real tokenizer and metadata, placeholder weights."""
    d = tmp_path_factory.mktemp("fake_engine")
    demo_tokenizer.save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(demo_tokenizer)}))
    (d / "modelopt_state.pth").write_bytes(b"placeholder")
    from helpers_engine import ENGINE_META

    (d / "lpx_engine.json").write_text(json.dumps(ENGINE_META))
    return d


@pytest.fixture(scope="module")
def cfg():
    return parse_config(demo_config_dict("checkpoint"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory, engine_dir: Path, cfg) -> tuple[Path, dict]:
    dest = tmp_path_factory.mktemp("repo")
    return dest, repo_stage.write_repository(dest, engine_dir, cfg)


def parsed(repo_dir: Path, model: str) -> mc.ModelConfig:
    return text_format.Parse((repo_dir / model / "config.pbtxt").read_text(), mc.ModelConfig())


def contract_models() -> dict:
    return json.loads(CONTRACT.read_text())["versions"]["latest"]["models"]


def tensors(conf: mc.ModelConfig, io: str) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in getattr(conf, io)}


def test_layout_and_summary(repo, engine_dir: Path, cfg) -> None:
    dest, summary = repo
    assert summary["models"] == [
        "preprocessing",
        "tensorrt_llm",
        "postprocessing",
        "ensemble",
        "tensorrt_llm_bls",
    ]
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert summary["files"] == len(files)
    for model in ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
        code = (dest / model / "1" / "model.py").read_text()
        first = [line for line in code.splitlines() if line.strip()][:2]
        assert first == ["import locale", 'locale.setlocale(locale.LC_ALL, "C.UTF-8")'], (
            first
        )  # before any import
    assert (dest / "ensemble" / "1").is_dir()
    for model in ("preprocessing", "postprocessing"):
        assert (dest / model / "1" / "tokenizer" / "tokenizer.json").is_file()
    engine_copy = dest / "tensorrt_llm" / "1" / "engine" / "modelopt_state.pth"
    assert engine_copy.read_bytes() == b"placeholder"
    assert engine_copy.stat().st_ino == (engine_dir / "modelopt_state.pth").stat().st_ino  # hard link


def test_configs_parse_and_are_relocatable(repo, cfg) -> None:
    dest, _ = repo
    for model in MODELS:
        conf = parsed(dest, model)
        assert conf.name == model and conf.max_batch_size == cfg.build.max_batch_size
        assert "${" not in (dest / model / "config.pbtxt").read_text()
        for key, param in conf.parameters.items():
            assert not param.string_value.startswith("/"), f"{model}.{key} must be relative"
            if key.endswith(("_dir", "_path")):
                assert (dest / model / param.string_value).is_dir(), f"{model}.{key} -> missing folder"
    assert parsed(dest, "tensorrt_llm").model_transaction_policy.decoupled
    assert parsed(dest, "tensorrt_llm").parameters["max_tokens_cap"].string_value == str(
        cfg.serving.max_tokens_cap
    )
    assert parsed(dest, "ensemble").platform == "ensemble"
    pre = {k: v.string_value for k, v in parsed(dest, "preprocessing").parameters.items()}
    assert (
        pre["apply_chat_template"] == "false" and pre["max_input_len"] == "512"
    )  # the engine's lpx_engine.json
    assert pre["max_tokens_cap"] == str(cfg.serving.max_tokens_cap)


def test_bls_model_matches_upstream(repo, cfg) -> None:
    upstream = contract_models()["tensorrt_llm_bls"]
    conf = parsed(repo[0], "tensorrt_llm_bls")
    assert conf.backend == "python" and conf.model_transaction_policy.decoupled
    assert conf.max_batch_size == cfg.build.max_batch_size
    assert [g.kind for g in conf.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
    assert set(conf.parameters) <= {p["key"] for p in upstream["parameters"]} | {
        "contract_version",
        "engine_counts_tokens",
    }
    assert conf.parameters["engine_counts_tokens"].string_value == "true"  # the torch engine sends the count
    assert conf.parameters["tensorrt_llm_model_name"].string_value == "tensorrt_llm"
    fill = {"${prompt_embedding_table_data_type}": "TYPE_FP16"}
    theirs = {
        t["name"]: (fill.get(t["data_type"], t["data_type"]), t["dims"], t.get("optional", False))
        for t in upstream["inputs"]
    }
    ours = {t.name: (mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in conf.input}
    assert ours == theirs, "every input of upstream's BLS, with its type, dims and optionality"
    out_theirs = {
        t["name"]: (t["data_type"].replace("${logits_datatype}", "TYPE_FP32"), t["dims"])
        for t in upstream["outputs"]
    }
    assert tensors(conf, "output") == out_theirs, "every output of upstream's BLS"


def test_ensemble_inputs_match_upstream(repo) -> None:
    upstream = contract_models()["ensemble"]
    conf = parsed(repo[0], "ensemble")
    theirs = {t["name"]: (t["data_type"], t["dims"]) for t in upstream["inputs"]}
    ours = tensors(conf, "input")
    assert ours == theirs, "every input of upstream's ensemble, with its type and dims"
    required = {t["name"] for t in upstream["inputs"] if not t.get("optional")}
    assert required <= set(ours)
    assert {
        "stream",
        "end_id",
        "pad_id",
        "top_k",
        "top_p",
        "temperature",
        "stop_words",
        "bad_words",
        "exclude_input_in_output",
    } <= set(ours)
    optional = {t.name for t in conf.input if t.optional}
    assert optional == set(ours) - required
    assert "return_num_output_tokens" in ours
    out_theirs = {
        t["name"]: (t["data_type"].replace("${logits_datatype}", "TYPE_FP32"), t["dims"])
        for t in upstream["outputs"]
    }
    assert tensors(conf, "output") == out_theirs, "every output of upstream's ensemble"


# LPX's python tensorrt_llm models fill upstream's data-type template variables with these
DTYPES = {"${" + k + "}": v for k, v in DEFAULT_DTYPES.items()}


@pytest.mark.parametrize("model", ["tensorrt_llm", "preprocessing", "postprocessing"])
def test_model_tensors_match_upstream(repo, model: str) -> None:
    upstream = contract_models()[model]
    conf = parsed(repo[0], model)
    for io, key in (("input", "inputs"), ("output", "outputs")):
        theirs = {t["name"]: (DTYPES.get(t["data_type"], t["data_type"]), t["dims"]) for t in upstream[key]}
        ours = tensors(conf, io)
        if model == "preprocessing" and io == "input":  # LPX's addition: the inputs it validates
            validated = {row[0] for row in VALIDATED_INPUTS["latest"]}
            assert all(conf_input.optional for conf_input in conf.input if conf_input.name in validated)
            ours = {n: v for n, v in ours.items() if n not in validated}
        if model == "tensorrt_llm":  # LPX's extension: top-k alternatives (tensors.LPX_TRTLLM), optional in
            extra = {spec.name for spec in LPX_TRTLLM}
            assert all(conf_input.optional for conf_input in conf.input if conf_input.name in extra)
            ours = {n: v for n, v in ours.items() if n not in extra}
        assert set(ours) <= set(theirs), f"{model} {io}s not upstream: {set(ours) - set(theirs)}"
        assert {n: theirs[n] for n in ours} == ours


def test_ensemble_wiring_matches_upstream_and_types_agree(repo) -> None:
    dest = repo[0]
    upstream = {s["model_name"]: s for s in contract_models()["ensemble"]["steps"]}
    ens = parsed(dest, "ensemble")
    produced = {t.name: t.data_type for t in ens.input}
    for step in ens.ensemble_scheduling.step:
        theirs = upstream[step.model_name]
        ours_map = dict(step.input_map)
        if step.model_name == "preprocessing":  # LPX's validated inputs: the same tensor, read to check it
            validated = {row[0] for row in VALIDATED_INPUTS["latest"]}
            assert all(ours_map[n] == n for n in validated)
            ours_map = {k: v for k, v in ours_map.items() if k not in validated}
        assert ours_map.items() <= theirs["input_map"].items()
        assert dict(step.output_map).items() <= theirs["output_map"].items()
        conf = parsed(dest, step.model_name)
        inputs = {t.name: t for t in conf.input}
        assert {t.name for t in conf.input if not t.optional} <= set(step.input_map)
        for model_input, tensor in step.input_map.items():
            assert tensor in produced, (
                f"{step.model_name}.{model_input} reads {tensor}, produced by nothing before"
            )
            assert produced[tensor] == inputs[model_input].data_type
        outputs = {t.name: t.data_type for t in conf.output}
        produced.update({tensor: outputs[name] for name, tensor in step.output_map.items()})
    assert {t.name: t.data_type for t in ens.output}.items() <= produced.items()


def test_non_torch_target_and_bad_engine_are_clear_errors(tmp_path: Path, engine_dir: Path, cfg) -> None:
    with pytest.raises(LpxError, match="lpx build"):
        repo_stage.write_repository(tmp_path / "r1", tmp_path, cfg)
    other = cfg.model_copy(deep=True)
    other.build.target = "llmapi"  # a torch engine folder is not an llmapi build folder
    with pytest.raises(LpxError, match=r"not an llmapi build folder .*build.target: llmapi"):
        repo_stage.write_repository(tmp_path / "r2", engine_dir, other)


# -- streaming detokenization, with the models' own functions ---------------------------------------
def metaspace_tokenizer():
    """A SentencePiece-style tokenizer (Metaspace + byte fallback): decoding a delta alone drops its space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pipeline.demo import corpus_text, paragraphs

    sp = Tokenizer(models.BPE(unk_token="<unk>"))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    sp.train_from_iterator(
        paragraphs(corpus_text()),
        trainer=trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
        ),
    )
    trained = json.loads(sp.to_str())["model"]
    vocab = dict(trained["vocab"])
    vocab.update({f"<0x{i:02X}>": len(vocab) + i for i in range(256)})  # ordinary tokens, as in Llama 2
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    sp.model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    sp.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=sp, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def stream_text(tokenizer, ids: list[int], step: int) -> list[str]:
    """What the ensemble streams: engine holdback (torch_engine.ready) then postprocessing's decode."""
    engine, post = load_model_module("torch_engine"), load_model_module("postprocessing")
    decode = post.AnchoredDecoder(tokenizer, skip_special_tokens=True)
    chunks, sent = [], 0
    for end in range(step, len(ids) + step, step):
        final = end >= len(ids)
        pending = ids[sent : min(end, len(ids))]
        if engine.ready(tokenizer, pending, final):
            chunks.append(decode(pending))
            sent = min(end, len(ids))
    return chunks


@pytest.mark.parametrize("kind", ["byte_level_bpe", "metaspace"])
@pytest.mark.parametrize("step", [1, 2])
def test_streamed_deltas_rebuild_the_text(kind: str, step: int, demo_tokenizer) -> None:
    tok = demo_tokenizer if kind == "byte_level_bpe" else metaspace_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False) + [tok.eos_token_id]
    whole = tok.decode(ids, skip_special_tokens=True)
    assert whole.strip() == TEXT
    chunks = stream_text(tok, ids, step)
    one_shot = load_model_module("postprocessing").AnchoredDecoder(tok, skip_special_tokens=True)(ids)
    assert "".join(chunks) == one_shot, "streamed text equals the non-streamed text"
    # Byte-level BPE: exactly the plain decode. SentencePiece: also keeps the space that the first
    # generated token carries (the output continues the prompt), which a plain decode strips.
    assert one_shot == (whole if kind == "byte_level_bpe" else " " + whole)
    assert not any("\ufffd" in c for c in chunks), "a multi-byte character was split"
    assert len(chunks) > len(TEXT.split()) // 2, "it still streams, not one chunk at the end"


def test_stop_words_cut_after_the_match() -> None:
    engine = load_model_module("torch_engine")
    assert engine.stop_at([5, 6, 7, 8, 9], 3, [[7, 8]]) == 4
    assert engine.stop_at([5, 6, 7, 8, 9], 4, [[7, 8]]) is None  # matched before this delta
    assert engine.stop_at([1, 2], 0, [[3]]) is None
