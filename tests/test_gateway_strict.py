"""The gateway refuses what OpenAI's API refuses (LPX issue 23): wrong types without coercion, numbers out
of range, bodies that are not strict JSON objects, bodies not sent as application/json, and a client that
leaves while sending its body - each over real HTTP to a real gateway in front of a real tritonserver
serving the demo's torch engine, answered with the exact status in OpenAI's error shape, the server still
ready afterwards, and never a traceback in the gateway's log.

One gateway for the module (`GatewayProcess`, as `lpx serve` starts it), key-less like a local one, on the
session's shared tritonserver (conftest's `torch_triton`).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

MODEL = "tiny-llama"
JSON = {"content-type": "application/json"}
BASE = {"model": MODEL, "prompt": "Bread is made", "max_tokens": 2, "temperature": 0}
USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": MODEL, "messages": USER, "max_tokens": 2, "temperature": 0}
MAX_BODY = 1_048_576


class Gateway:
    def __init__(self, url: str, log: Path, access: Path) -> None:
        self.url, self.log, self.access = url, log, access
        self.http = httpx.Client(base_url=url, trust_env=False, timeout=60)

    def post(self, path: str, body: object = None, raw: bytes | None = None, headers: dict | None = None):
        content = raw if raw is not None else json.dumps(body).encode()
        return self.http.post(path, content=content, headers=JSON if headers is None else headers)

    def access_lines(self, request_id: str) -> list[dict]:
        lines = self.access.read_text().splitlines() if self.access.exists() else []
        return [rec for rec in map(json.loads, lines) if rec["request_id"] == request_id]


@pytest.fixture(scope="module")
def gateway(torch_triton, tmp_path_factory):
    from helpers_engine import session_gateway

    root = tmp_path_factory.mktemp("strict")
    for proc in session_gateway(torch_triton, root, MODEL, max_body_bytes=MAX_BODY):
        gw = Gateway(proc.url, root / "gateway.log", root / "access.log")
        try:
            yield gw
        finally:
            gw.http.close()


def assert_refused(resp, status: int, param: str | None, words: str) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "invalid_request_error", error
    assert error["param"] == param and words in error["message"], error


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# (the body's change to BASE, or raw bytes, status, param, words in the message)
COMPLETIONS = [
    ({"max_tokens": "4"}, 400, "max_tokens", "valid integer, not a string"),
    ({"max_tokens": True}, 400, "max_tokens", "valid integer, not a boolean"),
    ({"max_tokens": 4.0}, 400, "max_tokens", "valid integer"),
    ({"max_tokens": 2**31}, 400, "max_tokens", "less than or equal to 2147483647"),
    ({"max_tokens": -1}, 400, "max_tokens", "greater than or equal to 1"),
    ({"max_tokens": None, "prompt": [1, 2, 3], "n": 10**12}, 400, "n", "less than or equal to 128"),
    ({"stream": "yes"}, 400, "stream", "valid boolean, not a string"),
    ({"stream": 1}, 400, "stream", "valid boolean, not a number"),
    ({"temperature": "0.5"}, 400, "temperature", "valid number, not a string"),
    ({"temperature": False}, 400, "temperature", "valid number, not a boolean"),
    ({"temperature": -0.1}, 400, "temperature", "greater than or equal to 0"),
    ({"top_p": 1.5}, 400, "top_p", "less than or equal to 1"),
    ({"top_k": 2**31}, 400, "top_k", "less than or equal to 2147483647"),
    ({"top_k": -2}, 400, "top_k", "greater than or equal to -1"),
    ({"top_k": "5"}, 400, "top_k", "valid integer"),
    ({"seed": 2**63}, 400, "seed", "less than or equal to 9223372036854775807"),
    ({"seed": 1.5}, 400, "seed", "valid integer"),
    ({"presence_penalty": -2.5}, 400, "presence_penalty", "greater than or equal to -2"),
    ({"frequency_penalty": "1"}, 400, "frequency_penalty", "valid number"),
    ({"logprobs": True}, 400, "logprobs", "valid integer, not a boolean"),
    ({"logprobs": 21}, 400, "logprobs", "less than or equal to 20"),
    ({"prompt": [True, False]}, 400, "prompt", "holds a boolean at [0]"),
    ({"prompt": [5, -1]}, 400, "prompt", "holds -1 at [1]"),
    ({"prompt": [[1, 2], [3, "x"]]}, 400, "prompt", "holds a string at [1][1]"),
    ({"prompt": [10**9]}, 400, "prompt", "outside the vocabulary"),
    ({"prompt": [2**40]}, 400, "prompt", "outside the vocabulary"),
    ({"prompt": {"text": "hi"}}, 400, "prompt", "not an object"),
    ({"prompt": None}, 400, "prompt", "not null"),
    ({"prompt": ["a", 1]}, 400, "prompt", "[1] is a number"),
    ({"prompt": []}, 400, "prompt", "empty"),
    ({"prompt": [[1, 2], []]}, 400, "prompt", "prompt[1] is empty"),
    ({"prompt": ["x"] * 3000}, 400, "prompt", "at most 2048"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4"),
    ({"stop": ["s"] * 1000}, 400, "stop", "has 1000 sequences"),
    ({"stop": "x" * 300}, 400, "stop", "may have 256"),
    ({"stop": [1]}, 400, "stop", "holds a number at [0]"),
    ({"stop": {"a": 1}}, 400, "stop", "not an object"),
    ({"stream_options": "x"}, 400, "stream_options", "valid dictionary"),
    ({"metadata": {"a": 1}}, 400, "metadata.a", "valid string"),
    ({"model": 5}, 400, "model", "valid string, not a number"),
    ({"model": ""}, 400, "model", "at least 1 character"),
    ({"user": ["me"]}, 400, "user", "valid string, not an array"),
    ({"echo": "false"}, 400, "echo", "valid boolean"),
    ({"frobnicate": 1}, 400, "frobnicate", "not a parameter"),
    (b'{"model": "tiny-llama", "prompt": "x", "max_tokens": 2, "max_tokens": 900}', 400, None, "twice"),
    (b'{"model": "tiny-llama", "prompt": "x", "temperature": 1e400}', 400, "temperature", "finite number"),
    (b'{"model": "tiny-llama", "prompt": "x", "temperature": NaN}', 400, None, "NaN is not a JSON value"),
    (b'{"model": "tiny-llama", "prompt": "x", "top_p": -Infinity}', 400, None, "-Infinity is not a JSON"),
    (
        b'{"model": "tiny-llama", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        400,
        None,
        "not valid JSON",
    ),
    (b"[]", 400, None, "must be a JSON object, not an array"),
    (b'"hello"', 400, None, "must be a JSON object, not a string"),
    (b"null", 400, None, "must be a JSON object, not null"),
    (b"", 400, None, "empty"),
    (b"{not json", 400, None, "not valid JSON"),
    (b'{"model": "tiny-llama", "prompt": "caf\xe9"}', 400, None, "not valid UTF-8"),
    (b'\xef\xbb\xbf{"model": "tiny-llama", "prompt": "x"}', 400, None, "not valid JSON"),
    (b'{"model": "tiny-llama", "prompt": "a\\ud800b"}', 400, None, "lone surrogate"),
    (
        b'{"model": "tiny-llama", "prompt": "x", "metadata": {"a": ' + deep(40).encode() + b"}}",
        400,
        None,
        "deeper than 32",
    ),
    (
        b'{"model": "tiny-llama", "prompt": "x", "p": ' + deep(20_000).encode() + b"}",
        400,
        None,
        "deeper than 32",
    ),
]


@pytest.mark.parametrize(("change", "status", "param", "words"), COMPLETIONS)
def test_completions_refusals(gateway, change, status, param, words) -> None:
    if isinstance(change, bytes):
        resp = gateway.post("/v1/completions", raw=change)
    else:
        resp = gateway.post("/v1/completions", {**BASE, **change})
    assert_refused(resp, status, param, words)
    assert gateway.http.get("/health/ready").status_code == 200


CHATS = [
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "required on a user"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "required on a user"),
    ({"messages": [{"role": "system", "content": None}, *USER]}, "messages[0].content", "system message"),
    ({"messages": [*USER, {"role": "assistant", "content": None}]}, "messages[1].content", "tool_calls"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id", "required"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "'user'"),
    ({"messages": [{"role": 5, "content": "hi"}]}, "messages[0].role", "'user'"),
    ({"messages": []}, "messages", "at least 1 item"),
    ({"messages": "hi"}, "messages", "valid list, not a string"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "not a number"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content",
        "only text parts",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content", "exactly"),
    ({"messages": [{"role": "user", "content": "hi", "name": "a b"}]}, "messages[0].name", "match pattern"),
    ({"messages": [{"role": "user", "content": "hi", "foo": 1}]}, "messages[0].foo", "not a parameter"),
    ({"messages": [{"role": "user", "content": "hi"}] * 5000}, "messages", "at most 4096"),
    ({"logprobs": "true"}, "logprobs", "valid boolean"),
    ({"top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
    ({"max_completion_tokens": 2**31}, "max_completion_tokens", "less than or equal to 2147483647"),
    ({"max_tokens": 2, "max_completion_tokens": 3}, "max_completion_tokens", "differ"),
    ({"tools": "all"}, "tools", "valid list"),
]


@pytest.mark.parametrize(("change", "param", "words"), CHATS)
def test_chat_refusals(gateway, change, param, words) -> None:
    assert_refused(gateway.post("/v1/chat/completions", {**CHAT, **change}), 400, param, words)
    assert gateway.http.get("/health/ready").status_code == 200


MEDIA = [
    {"content-type": "text/plain"},
    {},
    {"content-type": "application/x-www-form-urlencoded"},
    {"content-type": "multipart/form-data; boundary=x"},
    {"content-type": "application/json; charset=latin-1"},
    {"content-type": "application/jsonx"},
]


@pytest.mark.parametrize("headers", MEDIA, ids=lambda h: h.get("content-type", "none"))
def test_only_json_bodies_are_read(gateway, headers) -> None:
    """What a web page can send without a CORS preflight (text/plain, a form) is refused before the body
    is read, so a page cannot drive a key-less local gateway."""
    for path, body in (("/v1/completions", BASE), ("/v1/chat/completions", CHAT)):
        resp = gateway.post(path, body, headers=headers)
        assert_refused(resp, 415, "Content-Type", "application/json")
    assert gateway.http.get("/health/ready").status_code == 200


def test_body_past_the_limit_is_413(gateway) -> None:
    resp = gateway.post("/v1/completions", {**BASE, "prompt": "x" * (MAX_BODY + 10)})
    assert_refused(resp, 413, None, "max_body_bytes")
    assert gateway.http.get("/health/ready").status_code == 200


OK = [  # the positive controls: the same requests, well-formed
    ("/v1/completions", BASE, JSON),
    ("/v1/completions", BASE, {"content-type": "Application/JSON; charset=UTF-8"}),
    ("/v1/completions", {**BASE, "temperature": 1, "top_p": 0, "top_k": 2**31 - 1, "seed": 2**63 - 1}, JSON),
    ("/v1/completions", {**BASE, "prompt": [1, 2, 3], "stop": ["x" * 256], "n": 1, "logprobs": 0}, JSON),
    (
        "/v1/completions",
        {**BASE, "prompt": [[1, 2, 3]], "presence_penalty": -2, "metadata": {"a": "b"}},
        JSON,
    ),
    ("/v1/chat/completions", CHAT, JSON),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "caf\u00e9 \U0001f600"}]},
        JSON,
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "system", "content": [{"type": "text", "text": "be brief"}]}, *USER]},
        JSON,
    ),
]


@pytest.mark.parametrize(("path", "body", "headers"), OK)
def test_well_formed_requests_are_answered(gateway, path, body, headers) -> None:
    resp = gateway.post(path, body, headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] >= 1


def test_escaped_surrogate_pairs_are_text(gateway) -> None:
    """An emoji written as a JSON surrogate pair is one character (only a lone surrogate is refused)."""
    raw = b'{"model": "tiny-llama", "prompt": "smile \\ud83d\\ude00", "max_tokens": 2}'
    assert gateway.post("/v1/completions", raw=raw).status_code == 200


def test_the_openai_sdk_gets_bad_request_errors(gateway) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=60)
    calls = [
        (lambda: client.completions.create(model=MODEL, prompt="x", max_tokens="4"), "max_tokens"),
        (lambda: client.completions.create(model=MODEL, prompt="x", temperature="0.5"), "temperature"),
        (lambda: client.completions.create(model=MODEL, prompt=[True, False]), "prompt"),
        (lambda: client.completions.create(model=MODEL, prompt="x", extra_body={"top_k": 2**31}), "top_k"),
        (
            lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": None}]),
            "messages[0].content",
        ),
        (lambda: client.chat.completions.create(model=MODEL, messages=USER, stop=["a"] * 5), "stop"),
    ]
    for call, param in calls:
        with pytest.raises(openai.BadRequestError) as info:
            call()
        assert info.value.status_code == 400 and info.value.param == param, info.value.body
    got = client.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=0)
    assert got.usage.completion_tokens >= 1


def test_a_client_leaving_mid_body_is_499_once(gateway) -> None:
    """The client sends half of its declared body and closes: one access-log line with 499, no 500."""
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    rid = f"strict-{time.monotonic_ns()}"
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: 1000\r\nX-Request-Id: {rid}\r\n\r\n"
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + b'{"model": "tiny-llama", "prompt": "')
        time.sleep(0.2)  # the gateway is now reading the body
    deadline = time.monotonic() + 10
    while not gateway.access_lines(rid) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # a second line would come at once
    lines = gateway.access_lines(rid)
    assert [line["status"] for line in lines] == [499], lines
    assert gateway.http.get("/health/ready").status_code == 200


def test_nothing_was_a_500_and_no_traceback(gateway) -> None:
    """After every request above (this module's last test): no 500 in the access log, no traceback in the
    gateway's output (its stdout and stderr both go to its log)."""
    assert gateway.post("/v1/completions", {**BASE, "max_tokens": "4"}).status_code == 400
    statuses = [json.loads(line)["status"] for line in gateway.access.read_text().splitlines()]
    assert statuses and not [s for s in statuses if s >= 500], statuses
    log = gateway.log.read_text()
    assert "Traceback" not in log and "Exception" not in log, log[-3000:]
