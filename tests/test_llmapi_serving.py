"""The llmapi target served by a real tritonserver: LPX's `tensorrt_llm` python model over
`tensorrt_llm.LLM`. TensorRT-LLM cannot be installed here, so `tensorrt_llm` is the contract-checked
stand-in in tests/standin_tensorrt_llm (it refuses any LLM option, SamplingParams field or
generate_async keyword the contracts do not list, and runs transformers behind that interface).
Everything else is real: LPX's stages (quantize none -> llmapi build folder -> repository), Triton,
the ensemble, BLS, pre/postprocessing and tritonclient."""

from __future__ import annotations

import json
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
    monkeypatch.delitem(sys.modules, "tensorrt_llm", raising=False)
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
    assert kind == "LLM" and init["skip_tokenizer_init"] is True
    assert init["enable_iter_perf_stats"] is True, "LLM.get_stats has iterations for the metrics"
    assert stats["iter"] > 0 and stats["inflightBatchingStats"]["numScheduledRequests"] == 1, stats
    assert {k: init[k] for k in options} == options and init["model"] == str(engine_dir / "checkpoint")
    assert call["inputs"] == [5, 6, 7] and call["streaming"] is True and call["max_tokens"] == 6
    assert call["end_id"] == 2 and call["stop_token_ids"] == [9] and call["detokenize"] is False
    assert call["top_k"] == 1  # greedy, TensorRT-LLM's way
    assert 1 <= len(tokens) <= 6


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
