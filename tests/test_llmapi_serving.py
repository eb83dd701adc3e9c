"""The llmapi target served by a real tritonserver: LPX's `tensorrt_llm` python model over
`tensorrt_llm.LLM`. TensorRT-LLM cannot be installed here, so `tensorrt_llm` is the contract-checked
stand-in in tests/standin_tensorrt_llm (it refuses any LLM option, SamplingParams field or
generate_async keyword the contracts do not list, and runs transformers behind that interface).
Everything else is real: LPX's stages (quantize none -> llmapi build folder -> repository), Triton,
the ensemble, BLS, pre/postprocessing and tritonclient."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from helpers_engine import running_server

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.errors import LpxError

pytestmark = pytest.mark.slow  # every test needs the quantize -> build -> repo fixture
STANDIN = Path(__file__).parent / "standin_tensorrt_llm"
PROMPTS = ["The first token of an answer", "Bread is made"]
MAX_TOKENS = 24


def fresh_standin(monkeypatch) -> None:
    """Forget any imported tensorrt_llm (and its llmapi submodule), so the stand-in is imported anew."""
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        monkeypatch.delitem(sys.modules, name)


def llmapi_config(checkpoint: Path):
    data = demo_config_dict(str(checkpoint))
    data["variants"] = [{"name": "bf16", "quantization": {"format": "none"}}]
    data["build"]["target"] = "llmapi"
    return parse_config(data)


def greedy(folder: Path, prompt: str, eos: list[int]) -> list[int]:
    """transformers' greedy output ids (float32), stopping at any of `eos`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        return model.generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint, tmp_path_factory) -> tuple[Path, int]:
    """The tiny checkpoint with a second end-of-sequence id in generation_config.json (as Llama 3 has):
    the 6th token of the greedy answer to PROMPTS[0], so that answer must stop there."""
    import shutil

    dest = tmp_path_factory.mktemp("multi_eos") / "ckpt"
    shutil.copytree(tiny_checkpoint, dest)
    gen_cfg = json.loads((dest / "generation_config.json").read_text())
    eos = gen_cfg["eos_token_id"] if isinstance(gen_cfg["eos_token_id"], int) else gen_cfg["eos_token_id"][0]
    answer = greedy(dest, PROMPTS[0], [eos])
    extra = next(t for i, t in enumerate(answer) if i >= 5 and t not in answer[:i])
    gen_cfg["eos_token_id"] = [eos, extra]
    (dest / "generation_config.json").write_text(json.dumps(gen_cfg))
    return dest, extra


@pytest.fixture(scope="module")
def built(checkpoint, tmp_path_factory):
    """quantize (none) -> build (llmapi) -> repo through LPX's runner, in a private LPX_HOME."""
    from rich.console import Console

    from pipeline.progress import Reporter
    from pipeline.runner import Runner

    root = tmp_path_factory.mktemp("llmapi")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
        cfg = llmapi_config(checkpoint[0])
        outcome = Runner(cfg, Reporter(Console(file=open("/dev/null", "w")))).run(cfg.variants, "repo")[0]
    engine = next(a for k, a in outcome.artifacts.items() if k.startswith("build:"))
    repo = next(a for k, a in outcome.artifacts.items() if k.startswith("repo:"))
    return cfg, engine.path, repo.path, root


def test_repository_serves_the_llmapi_model(built) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg, engine, repo, _ = built
    code = (repo / "tensorrt_llm" / "1" / "model.py").read_text()
    assert "LlmApiEngine" in code and "TorchEngine" not in code
    conf = text_format.Parse((repo / "tensorrt_llm" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert conf.backend == "python" and conf.model_transaction_policy.decoupled
    params = {k: v.string_value for k, v in conf.parameters.items()}
    assert params["llmapi_dir"] == "1/engine" and params["tokenizer_dir"] == "1/engine/checkpoint"
    linked = repo / "tensorrt_llm" / "1" / "engine"
    assert (linked / "model.yaml").is_file() and (linked / "checkpoint" / "config.json").is_file()
    assert (linked / "checkpoint" / "config.json").stat().st_ino == (
        engine / "checkpoint" / "config.json"
    ).stat().st_ino


def test_triton_batch_above_the_builds_is_refused(built, tmp_path) -> None:
    from pipeline.stages.repository import write_repository

    cfg, engine, _, _ = built
    bigger = cfg.model_copy(deep=True)
    bigger.build.max_batch_size = cfg.build.max_batch_size * 2
    with pytest.raises(
        LpxError,
        match=rf"max_batch_size {bigger.build.max_batch_size} .*llmapi build's "
        rf"max_batch_size {cfg.build.max_batch_size}",
    ):
        write_repository(tmp_path / "repo", engine, bigger)
    assert not (tmp_path / "repo" / "tensorrt_llm").exists()


def test_engine_calls_the_api_as_the_contract_says(built, monkeypatch) -> None:
    """In-process, through the stand-in: the LLM gets the build's options, each request token ids,
    explicit end_id (no tokenizer in the LLM), every further EOS id as a stop token, detokenize off."""
    monkeypatch.syspath_prepend(str(STANDIN))
    fresh_standin(monkeypatch)
    import tensorrt_llm
    import yaml

    from pipeline.runtime.engines.llmapi_engine import LlmApiEngine

    assert tensorrt_llm.__version__.endswith("standin")
    _, engine_dir, _, _ = built
    options = yaml.safe_load((engine_dir / "llm_api_options.yaml").read_text())
    tensorrt_llm.CALLS.clear()
    with LlmApiEngine(engine_dir) as engine:
        tokens = engine.generate([5, 6, 7], 6, end_ids=[2, 9], temperature=0.0)
        with pytest.raises(LpxError, match="max_input_len"):
            engine.submit([5] * (options["max_input_len"] + 1), 4, end_ids=[2])
        stream = engine.submit([5, 6, 7], 50, end_ids=[2], temperature=0.0)
        next(stream)
        stream.cancel()
        rest = list(stream)
        assert stream.finished and len(stream.tokens) < 50 and len(rest) < 49
        penalised = dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=-0.2, min_tokens=3)
        engine.generate([5, 6, 7], 6, end_ids=[2], temperature=0.0, **penalised)
        with pytest.raises(LpxError, match="beam_width not supported"):
            engine.submit([5, 6, 7], 6, end_ids=[2], beam_width=4)
        penalised_call = tensorrt_llm.CALLS[-1][1]
        stream = engine.submit([5, 6, 7], 6, end_ids=[2], temperature=0.0, return_log_probs=True)
        list(stream)
        logprobs_call = tensorrt_llm.CALLS[-1][1]
        top = engine.submit(
            [5, 6, 7], 4, end_ids=[2], temperature=0.0, return_log_probs=True, top_log_probs_k=3
        )
        list(top)
        top_call = tensorrt_llm.CALLS[-1][1]
        stats = engine.iteration_stats()  # drained from LLM.get_stats
    assert top_call["logprobs"] == 3 and len(top.top) == len(top.tokens) >= 1
    for token, lp, (ids, values) in zip(top.tokens, top.logprobs, top.top, strict=True):
        assert len(ids) == 3 and ids[0] == token and values == sorted(values, reverse=True), (
            "greedy: the sampled token is the best of SamplingParams.logprobs = k's alternatives"
        )
        assert abs(values[0] - lp) < 1e-6
    assert logprobs_call["logprobs"] == 1 and "return_log_probs" not in logprobs_call
    assert len(stream.logprobs) == len(stream.tokens) >= 1 and all(lp <= 0 for lp in stream.logprobs), (
        "the sampled tokens' log probs come back from TokenLogprobs"
    )
    assert {k: penalised_call[k] for k in penalised} == penalised, (
        "the penalties and min_tokens reach SamplingParams"
    )
    (kind, init), (_, call) = tensorrt_llm.CALLS[0], tensorrt_llm.CALLS[1]
    # the LLM loads the checkpoint's tokenizer: its xgrammar backend builds the token table from it
    assert kind == "LLM" and init["skip_tokenizer_init"] is False
    assert init["guided_decoding_backend"] == "xgrammar"
    assert init["enable_iter_perf_stats"] is True, "LLM.get_stats has iterations for the metrics"
    assert stats["iter"] > 0 and stats["inflightBatchingStats"]["numScheduledRequests"] == 1, stats
    assert {k: init[k] for k in options} == options and init["model"] == str(engine_dir / "checkpoint")
    assert call["inputs"] == [5, 6, 7] and call["streaming"] is True and call["max_tokens"] == 6
    assert call["end_id"] == 2 and call["stop_token_ids"] == [9] and call["detokenize"] is False
    assert call["top_k"] == 1  # greedy, TensorRT-LLM's way
    assert 1 <= len(tokens) <= 6


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
}


def test_guides_become_guided_decoding_params(built, monkeypatch) -> None:
    """Each guide type reaches SamplingParams.guided_decoding as the GuidedDecodingParams field the contract
    names (json -> json_object, json_schema -> grammar: the torch target's EBNF of the schema, regex ->
    regex, ebnf_grammar -> grammar), enforced (the stand-in runs xgrammar as upstream's backend); an invalid
    guide, or min_tokens with a guide, is a LpxError before generate_async is called."""
    monkeypatch.syspath_prepend(str(STANDIN))
    fresh_standin(monkeypatch)
    import tensorrt_llm
    import xgrammar
    from transformers import AutoTokenizer

    from pipeline.runtime.engines.guides import _JSON_CHAR, schema_ebnf
    from pipeline.runtime.engines.llmapi_engine import LlmApiEngine

    _, engine_dir, _, _ = built
    tok = AutoTokenizer.from_pretrained(engine_dir / "checkpoint")
    eos = tok.eos_token_id
    schema = json.dumps(SCHEMA)
    guides = {
        "json": ("", {"json_object": True}),
        "json_schema": (schema, {"json_object": False, "grammar": schema_ebnf(xgrammar, schema)}),
        "regex": ("(yes|no)[0-9]{2}", {"json_object": False, "regex": "(yes|no)[0-9]{2}"}),
        "ebnf_grammar": ('root ::= "a" [bc]', {"json_object": False, "grammar": 'root ::= "a" [bc]'}),
    }
    assert _JSON_CHAR in guides["json_schema"][1]["grammar"], "the length-bounded string rule is JSON's"
    tensorrt_llm.CALLS.clear()
    answers = {}
    with LlmApiEngine(engine_dir) as engine:
        for kind, (guide, _) in guides.items():
            answers[kind] = engine.generate(
                [5, 6, 7],
                40,
                end_ids=[eos],
                temperature=0.0,
                guided_decoding_guide_type=kind,
                guided_decoding_guide=guide,
            )
        sent = [c for k, c in tensorrt_llm.CALLS if k == "generate_async"]
        bad = {
            "regex": ("(", "the regex guide is invalid"),
            "json_schema": ("{not json", "the json_schema guide is invalid"),
            "ebnf_grammar": ("root ::= ", "the ebnf_grammar guide is invalid"),
            "yaml": ("a: 1", "guided_decoding_guide_type 'yaml' is not supported - send one of"),
            "": ("[0-9]", "guided_decoding_guide needs guided_decoding_guide_type - send both"),
        }
        for kind, (guide, message) in bad.items():
            with pytest.raises(LpxError, match=re.escape(message)):
                engine.submit(
                    [5, 6], 4, end_ids=[eos], guided_decoding_guide_type=kind, guided_decoding_guide=guide
                )
        with pytest.raises(LpxError, match="min_tokens cannot be combined with guided decoding"):
            engine.submit([5, 6], 4, end_ids=[eos], min_tokens=4, guided_decoding_guide_type="json")
        assert len([k for k, _ in tensorrt_llm.CALLS if k == "generate_async"]) == len(guides), (
            "a refused guide never reaches generate_async"
        )
    for (kind, (_, fields)), call in zip(guides.items(), sent, strict=True):
        assert "guided_decoding_guide_type" not in call and "guided_decoding_guide" not in call
        assert call["guided_decoding"].fields == fields, kind
    text = {k: tok.decode([t for t in ids if t != eos]) for k, ids in answers.items()}
    assert re.fullmatch("(yes|no)[0-9]{2}", text["regex"]) and answers["regex"][-1] == eos, text
    assert text["ebnf_grammar"] in ("ab", "ac") and answers["ebnf_grammar"][-1] == eos, text
    if answers["json_schema"][-1] == eos:  # complete within 40 tokens: valid and as the schema says
        value = json.loads(text["json_schema"])
        assert set(value) == {"name", "n"} and len(value["name"]) <= 8 and isinstance(value["n"], int)


def test_standin_holds_guided_decoding_to_the_contract(built, monkeypatch) -> None:
    """Upstream's rules the engine relies on: a guided request needs an LLM made with
    guided_decoding_backend, the backend needs the LLM's tokenizer, and one guide per request."""
    monkeypatch.syspath_prepend(str(STANDIN))
    fresh_standin(monkeypatch)
    import asyncio

    from tensorrt_llm.llmapi import LLM, GuidedDecodingParams, SamplingParams

    model = str(built[1] / "checkpoint")
    with pytest.raises(AssertionError, match="needs the LLM's tokenizer"):
        LLM(model=model, skip_tokenizer_init=True, guided_decoding_backend="xgrammar")
    with pytest.raises(ValueError, match="Only one guide"):
        SamplingParams(end_id=2, guided_decoding=GuidedDecodingParams(regex="a", grammar='root ::= "a"'))
    llm = LLM(model=model, skip_tokenizer_init=True)

    async def guided_without_backend():
        llm.generate_async(
            [5, 6],
            sampling_params=SamplingParams(end_id=2, guided_decoding=GuidedDecodingParams(json_object=True)),
        )

    with pytest.raises(RuntimeError, match="GuidedDecoder is not setup"):
        asyncio.run(guided_without_backend())
    llm.shutdown()


@pytest.fixture(scope="module")
def server(built):
    _, _, repo, root = built
    yield from running_server(repo, root, LPX_TRITON_PYTHONPATH=str(STANDIN))  # the stub ignores PYTHONPATH


@pytest.fixture(scope="module")
def reference(built) -> dict[str, list[int]]:
    """transformers' greedy ids on the llmapi build's own checkpoint (the unified HF export), stopping at
    every end-of-sequence id of its generation_config.json."""
    from pipeline.runtime.engine_model import eos_ids

    hf = built[1] / "checkpoint"
    return {p: greedy(hf, p, eos_ids(hf)) for p in PROMPTS}


@pytest.fixture(scope="module")
def expected(built, reference) -> dict[str, str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built[1] / "checkpoint")
    return {p: tok.decode(ids, skip_special_tokens=True) for p, ids in reference.items()}


@pytest.mark.triton
def test_every_end_of_sequence_id_stops_the_answer(server, built, checkpoint, reference, expected) -> None:
    """generation_config.json lists two EOS ids; the second one ends PROMPTS[0]'s answer mid-way."""
    from pipeline.client import generate_stream
    from pipeline.runtime.engine_model import eos_ids

    extra = checkpoint[1]
    assert eos_ids(built[1] / "checkpoint")[1:] == [extra], "the export kept both end-of-sequence ids"
    answer = reference[PROMPTS[0]]
    assert answer[-1] == extra and len(answer) < MAX_TOKENS, "the reference itself stops at the second id"
    for stream in (True, False):
        text = "".join(
            c.text for c in generate_stream(server.grpc_url, PROMPTS[0], MAX_TOKENS, stream=stream)
        )
        assert text == expected[PROMPTS[0]]


@pytest.mark.triton
@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_greedy_text_through_triton_equals_transformers(server, expected, model: str) -> None:
    from pipeline.client import generate_stream

    for prompt in PROMPTS:
        chunks = list(generate_stream(server.grpc_url, prompt, MAX_TOKENS, model=model))
        assert "".join(c.text for c in chunks) == expected[prompt]


@pytest.mark.triton
def test_http_generate_and_token_counts(server, expected) -> None:
    import urllib.request

    prompt = PROMPTS[1]
    body = json.dumps(
        {"text_input": prompt, "max_tokens": MAX_TOKENS, "return_num_output_tokens": True}
    ).encode()
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/ensemble/generate",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    answer = json.loads(opener.open(req, timeout=120).read())
    assert answer["text_output"] == expected[prompt]
    assert 1 <= answer["num_output_tokens"] <= MAX_TOKENS


@pytest.mark.triton
def test_bad_requests_are_errors_and_the_server_keeps_serving(server, expected) -> None:
    from pipeline.client import generate_stream

    with pytest.raises(LpxError, match="max_tokens"):
        list(generate_stream(server.grpc_url, PROMPTS[0], 100000))
    chunks = list(generate_stream(server.grpc_url, PROMPTS[0], MAX_TOKENS))
    assert "".join(c.text for c in chunks) == expected[PROMPTS[0]]


@pytest.mark.triton
def test_the_backends_metric_families_come_from_tensorrt_llms_iteration_stats(server, built) -> None:
    """LLM.get_stats (enable_iter_perf_stats on) feeds the TensorRT-LLM backend's families on Triton's
    /metrics, the same names and labels the torch target and the C++ backend publish. The stand-in has no
    paged cache, so its KV-cache blocks stay 0 (a real TensorRT-LLM reports them)."""
    import time

    from pipeline.client import generate_stream
    from pipeline.monitoring.scrape import scrape
    from pipeline.runtime.trtllm_metrics import FAMILIES

    list(generate_stream(server.grpc_url, PROMPTS[1], MAX_TOKENS))
    time.sleep(0.5)  # a stats period or more
    metrics = scrape(server.metrics_url)
    general = "nv_trt_llm_general_metrics"
    assert (
        metrics.total(general, model="tensorrt_llm", general_type="iteration_counter") or 0
    ) >= MAX_TOKENS / 2
    max_batch = built[0].build.max_batch_size  # maxNumActiveRequests: the LLM's max_batch_size option
    assert metrics.total("nv_trt_llm_request_metrics", model="tensorrt_llm", request_type="max") == max_batch
    assert (metrics.total("nv_llm_output_token_len_count", model="tensorrt_llm") or 0) >= 1
    assert (metrics.total("nv_llm_input_token_len_sum", model="tensorrt_llm") or 0) > 0
    published = {name for name in metrics.samples if name.startswith(("nv_trt_llm_", "nv_llm_"))}
    assert {name for name, *_ in FAMILIES} <= {
        n.removesuffix("_count").removesuffix("_sum") for n in published
    }


@pytest.mark.triton
def test_a_guide_is_enforced_through_triton(server, expected) -> None:
    """Upstream's guide inputs on the ensemble and BLS reach the llmapi engine and are enforced; an invalid
    guide and min_tokens with a guide are errors naming the fix, and the server keeps serving."""
    from pipeline.client import generate_stream

    guide = {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "(yes|no)[0-9]{2}"}
    for model in ("ensemble", "tensorrt_llm_bls"):
        text = "".join(
            c.text for c in generate_stream(server.grpc_url, PROMPTS[0], MAX_TOKENS, model=model, **guide)
        )
        assert re.fullmatch("(yes|no)[0-9]{2}", text), (model, text)
    with pytest.raises(LpxError, match=r"the regex guide is invalid .* - send a valid one"):
        list(generate_stream(server.grpc_url, PROMPTS[0], 4, **{**guide, "guided_decoding_guide": "("}))
    with pytest.raises(LpxError, match="min_tokens cannot be combined with guided decoding"):
        list(generate_stream(server.grpc_url, PROMPTS[0], 8, min_tokens=4, **guide))
    chunks = list(generate_stream(server.grpc_url, PROMPTS[0], MAX_TOKENS))
    assert "".join(c.text for c in chunks) == expected[PROMPTS[0]]
