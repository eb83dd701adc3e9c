"""A real tritonserver on the generated repository: the ensemble's greedy text equals transformers'.

Needs `tritonserver` (nvidia-pytriton's bundled server or the NGC container's); skipped without it.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers_engine import STRONG_PENALTY, assert_penalty_bites, reference_greedy

from pipeline.errors import LpxError

pytestmark = [pytest.mark.triton, pytest.mark.slow]
PROMPTS = ["The first token of an answer", "Bread is made", "A good engineer", "Numbers tell stories"]
MAX_TOKENS = 40


def text_of(url: str, prompt: str, max_tokens: int = MAX_TOKENS, **params) -> tuple[str, int]:
    from pipeline.client import generate_stream

    chunks = list(generate_stream(url, prompt, max_tokens, model="ensemble", **params))
    return "".join(c.text for c in chunks), len(chunks)


def raw_stream(url: str, prompt: str, max_tokens: int, **lists: list[str]) -> str:
    """Stream with tritonclient directly, word lists shaped [1, n] as upstream's clients send them."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    arrays = {
        "text_input": np.array([[prompt.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        "stream": np.array([[True]]),
    }
    arrays.update({k: np.array([[w.encode() for w in v]], dtype=object) for k, v in lists.items()})
    inputs = []
    for name, arr in arrays.items():
        dtype = {np.dtype(object): "BYTES", np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL"}[arr.dtype]
        inputs.append(grpcclient.InferInput(name, list(arr.shape), dtype))
        inputs[-1].set_data_from_numpy(arr)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = ""
    try:
        client.async_stream_infer("ensemble", inputs)
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                raise LpxError(str(error))
            text += b"".join(result.as_numpy("text_output").reshape(-1)).decode()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return text
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


@pytest.fixture(scope="module")
def server(torch_triton):
    return torch_triton  # conftest.py: one server per session, shared with test_monitoring_live


@pytest.fixture(scope="module")
def reference_tokens(torch_engine_dir: Path) -> dict[str, list[int]]:
    """transformers' greedy output ids for each prompt, on the same restored quantized model."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(torch_engine_dir)
    return {
        p: reference_greedy(torch_engine_dir, tok(p)["input_ids"], MAX_TOKENS, tok.eos_token_id)
        for p in PROMPTS
    }


@pytest.fixture(scope="module")
def expected(torch_engine_dir: Path, reference_tokens: dict[str, list[int]]) -> dict[str, str]:
    """transformers' greedy text for each prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(torch_engine_dir)
    return {p: tok.decode(tokens, skip_special_tokens=True) for p, tokens in reference_tokens.items()}


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bench_counts_the_servers_tokens_not_responses(
    server, reference_tokens, model: str, protocol: str
) -> None:
    """lpx bench asks text models for num_output_tokens: per request, the counts add up to the ids the
    model generated (transformers' greedy reference), however the stream was cut into responses."""
    from pipeline.bench.load import LoadSpec, run_closed

    prompt = PROMPTS[1]
    url = server.grpc_url if protocol == "grpc" else server.http_url
    spec = LoadSpec(
        url=url, model=model, protocol=protocol, output_len=MAX_TOKENS, prompts=(prompt,), count_tokens=True
    )
    run = run_closed(spec, concurrency=2, requests=4)
    assert run.token_source == "num_output_tokens"
    want = len(reference_tokens[prompt])
    for rec in run.records:
        assert rec.error is None, rec.error
        assert sum(rec.tokens) == want, (rec.tokens, want)


def test_greedy_stream_equals_transformers(server, expected: dict[str, str]) -> None:
    for prompt in PROMPTS[:2]:
        text, chunks = text_of(server.grpc_url, prompt, stream=True)
        assert text == expected[prompt]
        assert chunks > 1, "tokens arrive one response at a time"
    text, _ = text_of(server.grpc_url, PROMPTS[2], stream=True, temperature=0.0, top_k=50, top_p=0.9)
    assert text == expected[PROMPTS[2]], "temperature 0 is greedy whatever top_k says"


def test_stream_concatenation_equals_non_streamed(server, expected: dict[str, str]) -> None:
    streamed, _ = text_of(server.grpc_url, PROMPTS[0], stream=True)
    whole, chunks = text_of(server.grpc_url, PROMPTS[0], stream=False)
    assert chunks == 1 and whole == streamed == expected[PROMPTS[0]]
    via_http, _ = text_of(server.http_url, PROMPTS[0], protocol="http", stream=True)
    assert via_http == streamed


def test_concurrent_streams_all_finish_with_their_own_text(server, expected: dict[str, str]) -> None:
    """Each stream equals its prompt served alone: the torch engine is batch-invariant by default
    (serving.batch_invariant; tests/test_batch_invariance.py), and alone it runs generate's shapes."""
    got: dict[str, str] = {}

    def run(prompt: str) -> None:
        got[prompt] = text_of(server.grpc_url, prompt, stream=True)[0]

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == expected


def test_sampling_and_limits(server) -> None:
    text, _ = text_of(server.grpc_url, PROMPTS[1], 16, stream=True, temperature=0.8, top_k=20, top_p=0.9)
    assert text.strip()
    with pytest.raises(LpxError, match="max_tokens_cap"):
        text_of(server.grpc_url, PROMPTS[1], 10_000, stream=True)
    with pytest.raises(LpxError, match="bad_words is not supported"):
        raw_stream(server.grpc_url, PROMPTS[1], 8, bad_words=["the"])


def test_stop_words_end_the_answer(server, torch_engine_dir: Path, expected: dict[str, str]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(torch_engine_dir)
    ids = tok(expected[PROMPTS[0]], add_special_tokens=False)["input_ids"]

    def roundtrips(i: int) -> bool:  # a two-token stop word that preprocessing encodes to the same ids
        return tok.encode(tok.decode(ids[i - 1 : i + 1]), add_special_tokens=False) == ids[i - 1 : i + 1]

    cut = next(i for i in range(3, len(ids)) if roundtrips(i))
    stop = tok.decode(ids[cut - 1 : cut + 1])
    text = raw_stream(server.grpc_url, PROMPTS[0], MAX_TOKENS, stop_words=[stop, "zzzz"])
    assert text == tok.decode(ids[: cut + 1]) and text.endswith(stop)
    # LPX's own client sends the same word list ([1, n] BYTES) and gets the same cut answer
    from pipeline.client import generate

    assert generate(server.grpc_url, PROMPTS[0], MAX_TOKENS, stop_words=[stop, "zzzz"]).text == text
    assert (
        generate(server.http_url, PROMPTS[0], MAX_TOKENS, protocol="http", stop_words=[stop, "zzzz"]).text
        == text
    )


# -- the BLS model, HTTP generate, request errors, many streams ----------------------------------------
def http_generate(url: str, model: str, body: dict) -> dict:
    """One POST /v2/models/<model>/generate (not streamed): the JSON answer, error or not."""
    import requests

    with requests.Session() as session:
        session.trust_env = False
        resp = session.post(
            f"http://{url.split('://')[-1]}/v2/models/{model}/generate",
            json=body,
            timeout=60,
            headers={"Connection": "close"},
        )
    return {"status": resp.status_code, **resp.json()}


def raw_request(url: str, model: str, arrays: dict) -> tuple[str, str | None]:
    """Stream one request with arrays typed exactly as given: (text, error message or None)."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    names = {
        np.dtype(object): "BYTES",
        np.dtype(np.int32): "INT32",
        np.dtype(bool): "BOOL",
        np.dtype(np.float32): "FP32",
        np.dtype(np.float16): "FP16",
        np.dtype(np.uint64): "UINT64",
    }
    inputs = []
    for name, arr in arrays.items():
        inputs.append(grpcclient.InferInput(name, list(arr.shape), names[arr.dtype]))
        inputs[-1].set_data_from_numpy(arr)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text, done = "", False
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                done = True
                return text, str(error)
            out = result.as_numpy("text_output")
            text += b"".join(out.reshape(-1)).decode() if out is not None else ""
            if result.get_response().parameters["triton_final_response"].bool_param:
                done = True
                return text, None
    finally:
        client.stop_stream(cancel_requests=not done)
        client.close()


def request_arrays(prompt, max_tokens, **extra) -> dict:
    import numpy as np

    text = (
        prompt
        if isinstance(prompt, np.ndarray)
        else np.array([[prompt if isinstance(prompt, bytes) else prompt.encode()]], dtype=object)
    )
    tokens = max_tokens if isinstance(max_tokens, np.ndarray) else np.array([[max_tokens]], dtype=np.int32)
    return {"text_input": text, "max_tokens": tokens, "stream": np.array([[True]]), **extra}


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_http_generate_not_streamed_gives_one_answer(server, expected: dict[str, str], model: str) -> None:
    got = http_generate(
        server.http_url, model, {"text_input": PROMPTS[1], "max_tokens": MAX_TOKENS, "stream": False}
    )
    assert got["status"] == 200 and "error" not in got, got
    text = got["text_output"]
    assert ("".join(text) if isinstance(text, list) else text) == expected[PROMPTS[1]]


def test_bls_streams_the_ensembles_text(server, expected: dict[str, str]) -> None:
    from pipeline.client import generate_stream

    for prompt in PROMPTS[:2]:
        chunks = list(generate_stream(server.grpc_url, prompt, MAX_TOKENS, model="tensorrt_llm_bls"))
        assert "".join(c.text for c in chunks) == expected[prompt] and len(chunks) > 1
    via_http = generate_stream(
        server.http_url, PROMPTS[0], MAX_TOKENS, model="tensorrt_llm_bls", protocol="http"
    )
    assert "".join(c.text for c in via_http) == expected[PROMPTS[0]]
    text, error = raw_request(server.grpc_url, "tensorrt_llm_bls", request_arrays(PROMPTS[0], MAX_TOKENS))
    assert error is None and text == expected[PROMPTS[0]]


def scalar_of(value):
    import numpy as np

    dtype = {bool: bool, int: np.int32, float: np.float32}[type(value)]
    return np.array([[value]], dtype=dtype)


# Malformed or unsupported sampling inputs: (extra inputs as JSON-able scalars, a fragment of the error).
# Each is sent through gRPC (typed as upstream declares) and through HTTP generate (JSON).
BAD_SAMPLING = {
    "top_p 2": ({"top_p": 2.0}, "top_p 2 is out of range"),
    "top_p -1": ({"top_p": -1.0}, "top_p -1 is out of range"),
    "top_p NaN": ({"top_p": float("nan")}, "top_p must be a finite number"),
    "temperature -1": ({"temperature": -1.0}, "temperature -1 is out of range"),
    "temperature NaN": ({"temperature": float("nan")}, "temperature must be a finite number"),
    "temperature inf": ({"temperature": float("inf")}, "temperature must be a finite number"),
    "top_k -5": ({"top_k": -5}, "top_k -5 is out of range"),
    "end_id 99999999": ({"end_id": 99999999}, "end_id 99999999 is not a token id"),
    "end_id -2": ({"end_id": -2}, "end_id -2 is not a token id"),
    "pad_id -3": ({"pad_id": -3}, "pad_id -3 is not a token id"),
    "beam_width 4": ({"beam_width": 4}, "beam_width = 4 is not supported by the `torch` target"),
    "beam_width 0": ({"beam_width": 0}, "beam_width 0 is out of range"),
    "num_return_sequences 3": ({"num_return_sequences": 3}, "num_return_sequences = 3 is not supported"),
    "repetition_penalty 0": ({"repetition_penalty": 0.0}, "repetition_penalty 0 is out of range"),
    "repetition_penalty NaN": ({"repetition_penalty": float("nan")}, "must be a finite number"),
    "presence_penalty inf": ({"presence_penalty": float("inf")}, "must be a finite number"),
    "frequency_penalty NaN": ({"frequency_penalty": float("nan")}, "must be a finite number"),
    "length_penalty NaN": ({"length_penalty": float("nan")}, "must be a finite number"),
    "min_tokens -1": ({"min_tokens": -1}, "min_tokens -1 is out of range"),
    "min_tokens above max_tokens": ({"min_tokens": 100}, "min_tokens 100 is above max_tokens 8"),
    "return_context_logits": (
        {"return_context_logits": True},
        "return_context_logits = True is not supported",
    ),
    "return_generation_logits": (
        {"return_generation_logits": True},
        "is not supported by the `torch` target",
    ),
    "prompt_vocab_size": ({"prompt_vocab_size": 5}, "prompt_vocab_size = 5 is not supported"),
}


def bad_requests() -> dict[str, tuple[dict, str]]:
    import numpy as np

    text = lambda v: np.array([[v.encode()]], dtype=object)  # noqa: E731
    cases = {
        "empty text_input": (request_arrays("", 8), "text_input is empty"),
        "blank text_input": (request_arrays("   ", 8), "text_input is empty"),
        "negative max_tokens": (
            request_arrays(PROMPTS[0], -3),
            "max_tokens must be between 1 and 512 (got -3)",
        ),
        "zero max_tokens": (request_arrays(PROMPTS[0], 0), "max_tokens must be between 1 and 512 (got 0)"),
        "oversized max_tokens": (request_arrays(PROMPTS[0], 10_000), "above this server's cap 512"),
        "over-long prompt": (request_arrays("river stone " * 400, 8), "above the engine's max_input_len 512"),
        "max_tokens as FP32": (
            request_arrays(PROMPTS[0], np.array([[8.0]], dtype=np.float32)),
            "inference input 'max_tokens' data-type is 'FP32', but model",
        ),
        "text_input as INT32": (
            request_arrays(np.array([[7]], dtype=np.int32), 8),
            "inference input 'text_input' data-type is 'INT32', but model",
        ),
        "invalid UTF-8": (request_arrays(b"ok \xff\xfe bytes", 8), "text_input is not valid UTF-8"),
        "decoder_text_input": (
            request_arrays(PROMPTS[0], 8, decoder_text_input=text("hello")),
            "LPX serves decoder-only models",
        ),
        "lora_task_id": (
            request_arrays(PROMPTS[0], 8, lora_task_id=np.array([[7]], dtype=np.uint64)),
            "lora_task_id = 7 is not supported",
        ),
        # guided decoding is served on torch (tests/test_structured.py); a bad guide type is refused
        "guided decoding": (
            request_arrays(PROMPTS[0], 8, guided_decoding_guide_type=text("yaml")),
            "guided_decoding_guide_type 'yaml' is not supported",
        ),
        "prompt table": (
            request_arrays(PROMPTS[0], 8, prompt_embedding_table=np.ones((1, 2, 8), np.float16)),
            "not supported",
        ),
        "embedding bias without weights": (
            request_arrays(PROMPTS[0], 8, embedding_bias_words=np.array([[b"river"]], dtype=object)),
            "embedding_bias_words has 1 entries and embedding_bias_weights 0",
        ),
    }
    for case, (extra, message) in BAD_SAMPLING.items():
        cases[case] = (request_arrays(PROMPTS[0], 8, **{k: scalar_of(v) for k, v in extra.items()}), message)
    cases["seed as UINT64 max is fine, top_p 2 is not"] = (
        request_arrays(PROMPTS[0], 8, seed=np.array([[2**64 - 1]], dtype=np.uint64), top_p=scalar_of(2.0)),
        "top_p 2 is out of range",
    )
    return cases


# Every optional input of upstream's ensemble and BLS that has a value meaning "the default", at it (the
# array-valued ones - prompt table, LoRA weights and config, images - default to absent).
UPSTREAM_DEFAULTS = {
    "decoder_text_input": "",
    "num_return_sequences": 1,
    "bad_words": "",
    "stop_words": "",
    "exclude_input_in_output": True,
    "top_k": 0,
    "top_p": 0.0,
    "temperature": 1.0,
    "length_penalty": 1.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "seed": 0,
    "return_log_probs": False,
    "return_context_logits": False,
    "return_generation_logits": False,
    "return_perf_metrics": False,
    "return_num_input_tokens": False,
    "return_num_output_tokens": False,
    "beam_width": 1,
    "embedding_bias_words": "",
    "guided_decoding_guide_type": "",
    "guided_decoding_guide": "",
}
BLS_DEFAULTS = {"num_draft_tokens": 0, "use_draft_logits": False}


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_every_upstream_input_at_its_default_changes_nothing(server, expected, model: str) -> None:
    import numpy as np

    defaults = {**UPSTREAM_DEFAULTS, **(BLS_DEFAULTS if model == "tensorrt_llm_bls" else {})}
    arrays = {}
    for name, value in defaults.items():
        if isinstance(value, str):
            arrays[name] = np.array([[value.encode()]], dtype=object)
        elif name == "seed":
            arrays[name] = np.array([[value]], dtype=np.uint64)
        else:
            arrays[name] = scalar_of(value)
    text, error = raw_request(server.grpc_url, model, request_arrays(PROMPTS[0], MAX_TOKENS, **arrays))
    assert error is None and text == expected[PROMPTS[0]], (text, error)
    got = http_generate(
        server.http_url,
        model,
        {"text_input": PROMPTS[0], "max_tokens": MAX_TOKENS, "stream": False, **defaults},
    )
    assert got["status"] == 200, got
    out = got["text_output"]
    assert ("".join(out) if isinstance(out, list) else out) == expected[PROMPTS[0]]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_input_counts_and_perf_metrics_come_back_when_asked(server, model: str) -> None:
    body = {"text_input": PROMPTS[0], "max_tokens": MAX_TOKENS, "stream": False}
    got = http_generate(
        server.http_url, model, {**body, "return_num_input_tokens": True, "return_perf_metrics": True}
    )
    assert got["status"] == 200, got
    one = lambda v: v[0] if isinstance(v, list) else v  # noqa: E731
    assert one(got["num_input_tokens"]) > 0 and one(got["num_output_tokens"]) == MAX_TOKENS
    times = [one(got[k]) for k in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns")]
    times.append(one(got["last_token_time_ns"]))
    assert 0 < times[0] <= times[1] <= times[2] <= times[3], times


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_penalties_min_tokens_and_log_probs_reach_the_torch_engine(
    server, torch_engine_dir, model: str
) -> None:
    """Through Triton, the same answers as the engine in-process (tests/test_torch_options.py checks those
    against transformers): a strong repetition penalty and min_tokens change the text as there (a mild one
    flips tokens only at CPU-dependent near-ties), and log probs
    come back as output_log_probs / cum_log_probs (sum within 1e-4 of the per-token ones, float32)."""
    from transformers import AutoTokenizer

    from pipeline.runtime.engines.torch_engine import TorchEngine

    N = 48  # long enough that the greedy text repeats a token (16 did not here: nothing to penalise)
    tok = AutoTokenizer.from_pretrained(torch_engine_dir)
    ids = tok(PROMPTS[0])["input_ids"]
    with TorchEngine(torch_engine_dir) as engine:
        eos = engine.default_end_ids
        plain = engine.generate(ids, N, end_ids=eos)
        penalised = engine.generate(ids, N, end_ids=eos, repetition_penalty=STRONG_PENALTY, min_tokens=N)
        stream = engine.submit(ids, N, end_ids=eos, return_log_probs=True)
        list(stream)
        logprobs = stream.logprobs
    assert_penalty_bites(ids, plain, penalised)
    body = {"text_input": PROMPTS[0], "max_tokens": N, "stream": False}
    got = http_generate(
        server.http_url, model, {**body, "repetition_penalty": STRONG_PENALTY, "min_tokens": N}
    )
    assert got["status"] == 200, got
    out = got["text_output"]
    assert ("".join(out) if isinstance(out, list) else out) == tok.decode(penalised, skip_special_tokens=True)
    got = http_generate(server.http_url, model, {**body, "return_log_probs": True})
    assert got["status"] == 200, got
    flat = np.array(got["output_log_probs"], dtype=np.float64).reshape(-1)
    assert np.allclose(flat, logprobs, atol=1e-6, rtol=0), (flat, logprobs)
    cum = float(np.array(got["cum_log_probs"]).reshape(-1)[0])
    assert abs(cum - sum(logprobs)) < 1e-4 and cum < 0


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server, expected, model: str) -> None:
    failures = {}
    for case, (arrays, message) in bad_requests().items():
        text, error = raw_request(server.grpc_url, model, arrays)
        if error is None or message not in error:
            failures[case] = (text, error)
    assert not failures, failures
    assert len(bad_requests()) >= 30
    got = http_generate(server.http_url, model, {"text_input": "", "max_tokens": 8, "stream": False})
    assert "text_input is empty" in got.get("error", ""), got
    assert got["status"] == 400, got
    for case, (extra, message) in BAD_SAMPLING.items():
        if any(isinstance(v, float) and not math.isfinite(v) for v in extra.values()):
            continue  # JSON has no NaN or infinity: covered over gRPC above
        got = http_generate(
            server.http_url, model, {"text_input": PROMPTS[0], "max_tokens": 8, "stream": False, **extra}
        )
        if got["status"] != 400 or message not in got.get("error", ""):
            failures[case] = got
    assert not failures, failures
    import requests

    for path in ("health/ready", f"models/{model}/ready"):
        ready = requests.get(f"http://{server.http_url.split('://')[-1]}/v2/{path}", timeout=10)
        assert ready.status_code == 200, f"/v2/{path} after every bad request: {ready.status_code}"
    text, error = raw_request(server.grpc_url, model, request_arrays(PROMPTS[3], MAX_TOKENS))
    assert error is None and text == expected[PROMPTS[3]], "still serving after the errors"


def test_32_concurrent_streams_all_get_their_greedy_text(server, expected: dict[str, str]) -> None:
    """32 streams at once, over the ensemble and BLS: each equals the same request made alone on this
    server (the needle rule of tests/test_batch_invariance.py; exact because the engine is batch-invariant)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(PROMPTS[i % len(PROMPTS)], ("ensemble", "tensorrt_llm_bls")[i % 2]) for i in range(32)]

    def run(job: tuple[str, str]) -> tuple[str, str | None]:
        return raw_request(server.grpc_url, job[1], request_arrays(job[0], MAX_TOKENS))

    alone = {job: run(job) for job in sorted(set(jobs))}
    assert all(err is None for _, err in alone.values()), alone
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    wrong = [(job, res) for job, res in zip(jobs, results, strict=True) if res != alone[job]]
    assert not wrong, f"{len(wrong)} of {len(jobs)} streams differ from the same request alone: {wrong[:3]}"
    assert {job[0]: text for job, (text, _) in alone.items()} == expected, "alone, greedy text is generate's"
