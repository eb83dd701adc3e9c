"""A real tritonserver on the generated repository: the ensemble's greedy text equals transformers'.

Needs `tritonserver` (nvidia-pytriton's bundled server or the NGC container's); skipped without it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from helpers_engine import reference_greedy, torch_engine_dir  # noqa: F401 - fixture

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.errors import PipelineError

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

    arrays = {"text_input": np.array([[prompt.encode()]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32), "stream": np.array([[True]])}
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
                raise PipelineError(str(error))
            text += b"".join(result.as_numpy("text_output").reshape(-1)).decode()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return text
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


@pytest.fixture(scope="module")
def server(torch_engine_dir: Path, tmp_path_factory):  # noqa: F811
    from pipeline.stages.repository import write_repository
    from pipeline.stages.serve import TritonServer, find_tritonserver

    try:
        find_tritonserver()
    except PipelineError as exc:
        pytest.skip(exc.message)
    root = tmp_path_factory.mktemp("triton")
    cfg = parse_config(demo_config_dict(str(root / "unused-checkpoint")))
    write_repository(root / "repo", torch_engine_dir, cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
        srv = TritonServer(root / "repo", log_path=root / "triton.log", ready_timeout_s=240)
        try:
            srv.start()
        except PipelineError as exc:
            pytest.fail(f"{exc.message}\n{exc.detail}")
        yield srv
        srv.stop()


@pytest.fixture(scope="module")
def expected(torch_engine_dir: Path) -> dict[str, str]:  # noqa: F811
    """transformers' greedy text for each prompt, on the same restored quantized model."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(torch_engine_dir)
    out = {}
    for prompt in PROMPTS:
        tokens = reference_greedy(torch_engine_dir, tok(prompt)["input_ids"], MAX_TOKENS, tok.eos_token_id)
        out[prompt] = tok.decode(tokens, skip_special_tokens=True)
    return out


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
    with pytest.raises(PipelineError, match="max_tokens_cap"):
        text_of(server.grpc_url, PROMPTS[1], 10_000, stream=True)
    with pytest.raises(PipelineError, match="bad_words is not supported"):
        raw_stream(server.grpc_url, PROMPTS[1], 8, bad_words=["the"])


def test_stop_words_end_the_answer(server, torch_engine_dir: Path, expected: dict[str, str]) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(torch_engine_dir)
    ids = tok(expected[PROMPTS[0]], add_special_tokens=False)["input_ids"]

    def roundtrips(i: int) -> bool:  # a two-token stop word that preprocessing encodes to the same ids
        return tok.encode(tok.decode(ids[i - 1:i + 1]), add_special_tokens=False) == ids[i - 1:i + 1]

    cut = next(i for i in range(3, len(ids)) if roundtrips(i))
    stop = tok.decode(ids[cut - 1:cut + 1])
    text = raw_stream(server.grpc_url, PROMPTS[0], MAX_TOKENS, stop_words=[stop, "zzzz"])
    assert text == tok.decode(ids[:cut + 1]) and text.endswith(stop)
    # LPX's own client sends the same word list ([1, n] BYTES) and gets the same cut answer
    from pipeline.client import generate

    assert generate(server.grpc_url, PROMPTS[0], MAX_TOKENS, stop_words=[stop, "zzzz"]).text == text
    assert generate(server.http_url, PROMPTS[0], MAX_TOKENS, protocol="http", stop_words=[stop, "zzzz"]).text == text
