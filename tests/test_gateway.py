"""The OpenAI gateway on a real tritonserver serving the demo's torch engine, called with the official
`openai` SDK (sync and async, streaming and not) and raw HTTP where the SDK cannot send what is tested.

One Triton and one gateway for the whole module. The reference for every text is the same greedy request
sent directly to `tensorrt_llm` over gRPC (token ids in, token ids out), decoded with the tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MODEL = "tiny-llama"
PROMPTS = ["Bread is made", "The first token of an answer", "A good engineer", "Numbers tell stories"]
ENDS_EARLY = "Once upon a time"  # the demo model says end-of-sequence after 14 tokens
CAP = 900  # serving.max_tokens_cap here (the default is 512): lets prompt + max_tokens pass 1024


@dataclass
class Served:
    """What the served stack's record (`$LPX_HOME/run/server.json`) says, and the serving process."""

    proc: subprocess.Popen
    grpc_url: str
    record: Path

    def triton_pid(self) -> int:
        import psutil

        return next(
            p.pid
            for p in psutil.Process(self.proc.pid).children()
            if "tritonserver" in " ".join(p.cmdline()) and "pipeline.gateway" not in " ".join(p.cmdline())
        )


@dataclass
class Stack:
    triton: Served
    url: str  # the gateway's base URL
    key: str
    key_id: str
    rpm_key: str
    tpm_key: str
    tokenizer: object
    root: Path

    def client(self, key: str | None = None, **kw):
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=key or self.key, max_retries=0, timeout=120, **kw
        )

    def aclient(self, key: str | None = None):
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=key or self.key, max_retries=0, timeout=300
        )

    def http(self, method: str, path: str, key: str | None = "main", **kw) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if key:
            headers["Authorization"] = f"Bearer {self.key if key == 'main' else key}"
        with httpx.Client(trust_env=False, timeout=120) as c:
            return c.request(method, f"{self.url}{path}", headers=headers, **kw)


# What `lpx serve` runs once the stages are done (pipeline/served.py): Triton, the gateway beside it,
# until SIGTERM; here on a repository written from the test engine
SERVE = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from pipeline.config import parse_config
from pipeline.progress import Reporter
from pipeline.served import serve_forever_repo
serve_forever_repo(parse_config(json.loads(sys.argv[1])), "fp8", SimpleNamespace(path=Path(sys.argv[2])), Reporter())
"""


@pytest.fixture(scope="module")
def stack(torch_engine_dir: Path, tmp_path_factory):
    """`lpx serve`'s Triton + gateway on the demo's torch engine, with three API keys: one plain, one
    allowed 2 requests per minute, one 30 tokens per minute. serving.max_tokens_cap is 900 (the
    default 512), so that prompt + max_tokens can pass max_seq_len 1024."""
    from transformers import AutoTokenizer

    from pipeline.config import parse_config
    from pipeline.demo import demo_config_dict
    from pipeline.errors import LpxError
    from pipeline.gateway.api_keys import add_key
    from pipeline.servers.child import log_tail
    from pipeline.servers.tritonserver import find_tritonserver
    from pipeline.stages.repository import write_repository

    try:
        find_tritonserver()
    except LpxError as exc:
        pytest.skip(exc.message)
    root = tmp_path_factory.mktemp("gateway")
    data = demo_config_dict(str(root / "unused-checkpoint"))
    data["serving"]["max_tokens_cap"] = (
        CAP  # the engine's and the gateway's (a gateway cap may only lower it)
    )
    write_repository(root / "repo", torch_engine_dir, parse_config(data))
    keys = root / "keys.json"
    main, secret = add_key(keys, "tests")
    rpm = add_key(keys, "rpm", requests_per_minute=2)[1]
    tpm = add_key(keys, "tpm", tokens_per_minute=30)[1]
    data["model"]["name"] = MODEL
    data["serving"]["max_tokens_cap"] = CAP
    data["serving"]["openai"] = {
        "port": 0,
        "api_keys_file": str(keys),
        "access_log": str(root / "access.log"),
        "max_body_bytes": 64 * 1024,
        "drain_timeout_s": 20,
    }
    env = {**os.environ, "LPX_HOME": str(root / "home")}
    record = root / "home" / "run" / "server.json"
    log = root / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, json.dumps(data), str(root / "repo")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not record.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"lpx serve did not come up:\n{log_tail(log)}")
            time.sleep(0.2)
        info = json.loads(record.read_text())
        served = Served(proc, info["grpc_url"], record)
        tokenizer = AutoTokenizer.from_pretrained(root / "repo" / "preprocessing" / "1" / "tokenizer")
        yield Stack(served, info["openai_url"], secret, main.id, rpm, tpm, tokenizer, root)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def direct_ids(stack: Stack, ids: list[int], max_tokens: int) -> list[int]:
    """Greedy token ids from `tensorrt_llm` itself over gRPC (the gateway's reference)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    arrays = {
        "input_ids": np.array([ids], np.int32),
        "input_lengths": np.array([[len(ids)]], np.int32),
        "request_output_len": np.array([[max_tokens]], np.int32),
        "end_id": np.array([[stack.tokenizer.eos_token_id]], np.int32),
        "temperature": np.array([[0.0]], np.float32),
        "streaming": np.array([[True]]),
    }
    inputs = []
    for name, arr in arrays.items():
        dtype = {"int32": "INT32", "float32": "FP32", "bool": "BOOL"}[arr.dtype.name]
        inputs.append(grpcclient.InferInput(name, list(arr.shape), dtype))
        inputs[-1].set_data_from_numpy(arr)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(stack.triton.grpc_url)
    out: list[int] = []
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=120)
            assert error is None, error
            got = result.as_numpy("output_ids")
            if got is not None:
                out += got.reshape(-1).tolist()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


def prompt_ids(stack: Stack, prompt: str) -> list[int]:
    return stack.tokenizer(prompt)["input_ids"]


def chat_ids(stack: Stack, messages: list[dict]) -> list[int]:
    text = stack.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return stack.tokenizer(text, add_special_tokens=False)["input_ids"]


def expect(stack: Stack, ids: list[int], max_tokens: int) -> tuple[str, list[int]]:
    out = direct_ids(stack, ids, max_tokens)
    return stack.tokenizer.decode(out, skip_special_tokens=True), out


def finish_of(out: list[int], max_tokens: int, eos: int) -> str:
    return "stop" if out and out[-1] == eos else "length" if len(out) >= max_tokens else "stop"


# -- the fast path equals the engine ---------------------------------------------------------------
def test_completion_equals_the_direct_grpc_request(stack: Stack) -> None:
    client = stack.client()
    assert [m.id for m in client.models.list().data] == [MODEL]
    eos = stack.tokenizer.eos_token_id
    for prompt, n in ((PROMPTS[0], 24), (ENDS_EARLY, 40)):
        ids = prompt_ids(stack, prompt)
        text, out = expect(stack, ids, n)
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0)
        assert got.choices[0].text == text
        assert got.choices[0].finish_reason == finish_of(out, n, eos)
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), len(out))
        assert got.usage.total_tokens == len(ids) + len(out)
    assert finish_of(out, 40, eos) == "stop" and out[-1] == eos, "the end-of-sequence id is counted"
    # a prompt sent as token ids is served the same
    ids = prompt_ids(stack, PROMPTS[1])
    text, _ = expect(stack, ids, 12)
    assert (
        client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0).choices[0].text
        == text
    )


def test_streams_sync_have_one_finish_reason_and_usage(stack: Stack) -> None:
    client = stack.client()
    ids = prompt_ids(stack, PROMPTS[2])
    text, out = expect(stack, ids, 20)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPTS[2],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.text for p in pieces) == text and len(pieces) > 2
    assert [p.finish_reason for p in pieces if p.finish_reason] == ["length"]
    assert pieces[-1].finish_reason == "length" and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(out) and chunks[-1].usage.prompt_tokens == len(ids)
    assert all(c.usage is None for c in chunks[:-1])
    # chat: the first delta carries the role; the text equals the engine's for the templated prompt
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me about bread."},
    ]
    ids = chat_ids(stack, messages)
    text, out = expect(stack, ids, 16)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert deltas[0].delta.role == "assistant"
    assert all(d.delta.role is None for d in deltas[1:])
    assert "".join(d.delta.content or "" for d in deltas) == text
    assert [d.finish_reason for d in deltas if d.finish_reason] == [
        finish_of(out, 16, stack.tokenizer.eos_token_id)
    ]
    assert chunks[-1].usage.prompt_tokens == len(ids) and chunks[-1].usage.completion_tokens == len(out)
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content == text
    assert whole.usage.completion_tokens == len(out)


def test_async_client_streaming_and_not(stack: Stack) -> None:
    messages = [{"role": "user", "content": "Numbers tell stories"}]
    text, out = expect(stack, chat_ids(stack, messages), 12)

    async def run() -> tuple[str, str]:
        async with stack.aclient() as client:
            whole = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=12, temperature=0
            )
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return whole.choices[0].message.content, "".join(parts)

    assert asyncio.run(run()) == (text, text)


def test_stop_sequences_cut_without_leaking(stack: Stack) -> None:
    client = stack.client()
    prompt = PROMPTS[1]
    text, _ = expect(stack, prompt_ids(stack, prompt), 40)
    at = next(i for i in range(len(text) // 2, len(text) - 3) if text.find(text[i : i + 3]) == i)
    stop = text[at : at + 3]
    for stops in (stop, ["zzzz", stop]):
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=stops)
        assert got.choices[0].text == text[:at] and got.choices[0].finish_reason == "stop"
        streamed = [
            c.choices[0]
            for c in client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=stops, stream=True
            )
        ]
        assert "".join(c.text for c in streamed) == text[:at]
        assert [c.finish_reason for c in streamed if c.finish_reason] == ["stop"]
    # a stop string whose start is the answer's last characters: held back, then sent when it never completes
    tail = text[-2:] + "\u00a7\u00a7"
    got = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=tail, stream=True
    )
    assert "".join(c.choices[0].text for c in got) == text


def test_logprobs_and_penalties_reach_the_engine(stack: Stack) -> None:
    """logprobs (chat: true) asks tensorrt_llm for output_log_probs: one per completion token, of the
    penalized distribution before truncation (a greedy token's own log probability, not log 1);
    presence / frequency penalties reach the engine (the torch target honours them). Alternatives
    (top_logprobs) come from the same distribution: the greedy token is the first of them."""
    client = stack.client()
    messages = [{"role": "user", "content": "Bread"}]
    got = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True
    )
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens >= 1
    assert all(-1e4 < t.logprob <= 0.0 for t in content) and any(t.logprob < 0 for t in content)
    penalised = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[0],
        max_tokens=8,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=0.5,
    )
    assert penalised.usage.completion_tokens >= 1 and penalised.choices[0].finish_reason in ("stop", "length")
    top = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    for tok in top.choices[0].logprobs.content:
        assert len(tok.top_logprobs) == 3 and tok.top_logprobs[0].token == tok.token


# -- what is refused ------------------------------------------------------------------------------
REFUSED = [
    ({"n": 129}, 400, "n", "less than or equal to 128"),
    ({"prompt": [PROMPTS[0]] * 43, "n": 3}, 400, "prompt", "at most 128"),
    ({"best_of": 3}, 400, "best_of", "best_of"),
    ({"logit_bias": {"50": 10}}, 400, "logit_bias", "logit_bias"),
    ({"suffix": "end"}, 400, "suffix", "suffix"),
    ({"echo": True, "logprobs": 0}, 400, "echo", "prompt's log probabilities"),
    ({"logprobs": 21}, 400, "logprobs", "less than or equal to 20"),
    ({"min_tokens": 5}, 400, "min_tokens", "above max_tokens 4"),
    ({"repetition_penalty": 0}, 400, "repetition_penalty", "greater than 0"),
    ({"max_tokens": 950}, 400, "max_tokens", f"limit of {CAP}"),
    ({"prompt": "word " * 200, "max_tokens": 800}, 400, "max_tokens", "max_seq_len 1024"),
    ({"prompt": "word " * 600}, 400, "prompt", "max_input_len 512"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"temperature": 3}, 400, "temperature", "less than or equal to 2"),
    ({"max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1"),
    ({"frobnicate": 1}, 400, "frobnicate", "not a parameter"),
    ({"model": "gpt-4"}, 404, "model", "serves 'tiny-llama'"),
    ({"presence_penalty": 3.5}, 400, "presence_penalty", "less than or equal to 2"),
    ({"seed": -(2**63) - 1}, 400, "seed", "greater than or equal to -9223372036854775808"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options", "stream: true"),
]


@pytest.mark.parametrize(("extra", "status", "param", "words"), REFUSED)
def test_refusals_are_openai_shaped(
    stack: Stack, extra: dict, status: int, param: str | None, words: str
) -> None:
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4, **extra}
    resp = stack.http("POST", "/v1/completions", json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_chat_refusals_and_malformed_bodies(stack: Stack) -> None:
    client = stack.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f"}}] * 2,
        )
    assert info.value.param == "tools" and "same name" in info.value.message
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "model_not_found"
    for raw, words in ((b"{not json", "not valid JSON"), (b"[]", "must be a JSON object")):
        resp = stack.http(
            "POST", "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400 and words in resp.json()["error"]["message"], resp.text
    resp = stack.http("POST", "/v1/chat/completions", json={"model": MODEL})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    big = {"model": MODEL, "prompt": "x" * 70_000}
    resp = stack.http("POST", "/v1/completions", json=big)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    chunked = stack.http(
        "POST",
        "/v1/completions",
        content=iter([b"{" + b" " * 40_000] * 2),
        headers={"content-type": "application/json"},
    )
    assert chunked.status_code == 413, "a chunked body past the limit is refused too"
    resp = stack.http("GET", "/v1/nothing")
    assert resp.status_code == 404 and set(resp.json()["error"]) == {"message", "type", "param", "code"}
    # POSTs to the generation routes skip FastAPI; another method still gets its 405, in OpenAI's shape
    resp = stack.http("GET", "/v1/chat/completions")
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed", resp.text
    assert resp.headers["x-request-id"].startswith("req-")


# -- keys and limits -------------------------------------------------------------------------------
def test_api_keys_are_required_once_they_exist(stack: Stack) -> None:
    resp = stack.http(
        "POST", "/v1/completions", key=None, json={"model": MODEL, "prompt": "x", "max_tokens": 1}
    )
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError) as info:
        stack.client("lpx-not-a-key").models.list()
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    for path in ("/health/live", "/health/ready", "/metrics"):
        assert stack.http("GET", path, key=None).status_code == 200, path


def test_rate_limits_answer_429_with_retry_after(stack: Stack) -> None:
    client = stack.client(stack.rpm_key)
    for _ in range(2):
        client.completions.create(model=MODEL, prompt="Bread", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model=MODEL, prompt="Bread", max_tokens=1)
    assert info.value.type == "requests" and info.value.code == "rate_limit_exceeded"
    assert 1 <= int(info.value.response.headers["retry-after"]) <= 60
    tokens = stack.client(stack.tpm_key)
    first = tokens.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0)
    assert first.usage.total_tokens > 30
    with pytest.raises(openai.RateLimitError) as info:
        tokens.completions.create(model=MODEL, prompt="Bread", max_tokens=1)
    assert info.value.type == "tokens" and int(info.value.response.headers["retry-after"]) >= 1


# -- operations ------------------------------------------------------------------------------------
def triton_cpu_s(stack: Stack) -> float:
    """CPU seconds used so far by tritonserver and its python stubs (where the torch engine runs)."""
    import psutil

    root = psutil.Process(stack.triton.triton_pid())
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def test_a_client_that_disconnects_stops_the_engine(stack: Stack) -> None:
    """A client that leaves after the first chunk cancels the call. The answer is forced long (ignore_eos,
    N tokens), so its engine CPU is measurable on any CPU; the abandoned call's whole CPU cost, counted
    until well after a call that kept going would have ended, stays a small part of a whole answer's.
    (An absolute floor on the whole answer's CPU broke on a fast CPU: 120 tokens cost 0.50 s there.)"""
    client = stack.client()
    n = 300
    ask = dict(model=MODEL, prompt=PROMPTS[2], max_tokens=n, temperature=0, extra_body={"ignore_eos": True})
    before, t0 = triton_cpu_s(stack), time.monotonic()
    whole = client.completions.create(**ask)
    wall, full_cpu = time.monotonic() - t0, triton_cpu_s(stack) - before
    assert whole.usage.completion_tokens == n
    before = triton_cpu_s(stack)
    stream = client.completions.create(
        **ask, stream=True, extra_headers={"x-request-id": "req-disconnect-test"}
    )
    next(iter(stream))
    stream.close()  # the client goes away after the first chunk
    time.sleep(max(1.0, 1.5 * wall))  # an engine that kept going would have finished by now
    abandoned_cpu = triton_cpu_s(stack) - before
    assert abandoned_cpu < 0.4 * full_cpu, (abandoned_cpu, full_cpu, wall)
    line = _log_line(stack, "req-disconnect-test")
    assert line["status"] == 499 and line["completion_tokens"] < n // 3 and line["stream"] is True


def test_200_concurrent_streams_are_all_correct(stack: Stack) -> None:
    want = {p: expect(stack, prompt_ids(stack, p), 6)[0] for p in PROMPTS}

    async def one(client, prompt: str) -> tuple[str, str, str | None]:
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=6, temperature=0, stream=True
        )
        parts, reasons = [], []
        async for c in stream:
            parts.append(c.choices[0].text)
            reasons += [c.choices[0].finish_reason] if c.choices[0].finish_reason else []
        return prompt, "".join(parts), reasons

    async def run() -> list:
        async with stack.aclient() as client:
            return await asyncio.gather(*(one(client, PROMPTS[i % len(PROMPTS)]) for i in range(200)))

    t0 = time.perf_counter()
    results = asyncio.run(run())
    wrong = [(p, got) for p, got, _ in results if got != want[p]]
    assert not wrong and len(results) == 200, wrong[:3]
    assert all(len(reasons) == 1 for _, _, reasons in results)
    assert time.perf_counter() - t0 < 300


def _log_line(stack: Stack, request_id: str) -> dict:
    for _ in range(50):
        lines = [json.loads(x) for x in (stack.root / "access.log").read_text().splitlines()]
        found = [x for x in lines if x["request_id"] == request_id]
        if found:
            return found[-1]
        time.sleep(0.1)
    raise AssertionError(f"no access-log line for {request_id}")


def test_access_log_and_metrics(stack: Stack) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    client = stack.client()
    got = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Bread"}],
        max_tokens=5,
        temperature=0,
        extra_headers={"x-request-id": "req-log-test"},
    )
    line = _log_line(stack, "req-log-test")
    assert (
        line["key_id"] == stack.key_id and line["route"] == "/v1/chat/completions" and line["status"] == 200
    )
    assert (line["prompt_tokens"], line["completion_tokens"]) == (
        got.usage.prompt_tokens,
        got.usage.completion_tokens,
    )
    assert line["finish_reason"] == got.choices[0].finish_reason and line["stream"] is False
    assert line["ttft_ms"] > 0 and line["latency_ms"] >= line["ttft_ms"] and "prompt" not in line
    text = stack.http("GET", "/metrics", key=None).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    route = (("route", "/v1/chat/completions"),)
    assert (
        samples[("lpx_gateway_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))] >= 1
    )
    assert samples[("lpx_gateway_requests_total", (("route", "/v1/completions"), ("status", "400")))] >= 1
    assert samples[("lpx_gateway_time_to_first_token_seconds_count", route)] >= 1
    assert samples[("lpx_gateway_e2e_request_latency_seconds_count", route)] >= 1
    assert samples[("lpx_gateway_inter_token_latency_seconds_count", route)] >= 1
    assert samples[("lpx_gateway_completion_tokens_total", route)] >= got.usage.completion_tokens
    assert samples[("lpx_gateway_prompt_tokens_total", route)] >= got.usage.prompt_tokens
    assert samples[("lpx_gateway_requests_in_flight", ())] == 0


def test_bench_and_generate_speak_openai(stack: Stack, monkeypatch) -> None:
    from click.testing import CliRunner

    from pipeline.bench.load import LoadSpec, run_closed
    from pipeline.cli import cli

    ids = prompt_ids(stack, PROMPTS[0])
    text, out = expect(stack, ids, 8)
    spec = LoadSpec(
        url=stack.url,
        model=MODEL,
        protocol="openai",
        endpoint="completions",
        api_key=stack.key,
        output_len=8,
        prompts=(PROMPTS[0],),
    )
    run = run_closed(spec, concurrency=2, requests=4)
    assert run.token_source == "usage"
    for rec in run.records:
        assert rec.error is None, rec.error
        assert (
            sum(rec.tokens) == len(out) and rec.input_tokens == len(ids) and rec.input_counted_by == "usage"
        )
    monkeypatch.setenv("LPX_API_KEY", stack.key)
    res = CliRunner().invoke(
        cli, ["generate", PROMPTS[0], "--api", "openai", "--url", stack.url, "--max-tokens", "8"]
    )
    assert res.exit_code == 0 and res.output == text + "\n", res.output
    res = CliRunner().invoke(
        cli, ["generate", "x", "--api", "openai", "--url", stack.url, "--max-tokens", "5000"]
    )
    assert res.exit_code == 1 and "limit of 900" in str(res.exception or res.output)


def test_sigterm_drains_streams_then_stops_triton(stack: Stack) -> None:
    """Last test of the module: SIGTERM to `lpx serve` mid-stream lets the stream finish through the
    gateway (which accepts no new connection), then Triton stops and lpx serve exits 0."""
    prompt = PROMPTS[2]  # a 120-token answer: seconds of streaming on the CPU
    text, _ = expect(stack, prompt_ids(stack, prompt), 120)
    client = stack.client()
    stream = iter(
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=120, temperature=0, stream=True)
    )
    parts = [next(stream).choices[0].text]
    stack.triton.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # lpx serve notices within 0.5 s and SIGTERMs the gateway, which stops listening
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{stack.url}/health/live", trust_env=False, timeout=5)
    parts += [c.choices[0].text for c in stream]
    assert "".join(parts) == text
    assert stack.triton.proc.wait(timeout=60) == 0
    assert not stack.triton.record.exists()
    log = (stack.root / "serve.log").read_text()
    assert "draining the gateway's streams" in log and "stopped" in log
