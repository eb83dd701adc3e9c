"""The gateway's transport under hostile clients, over raw sockets against a real gateway process on a real
tritonserver serving the fixed-delay toy engine (pipeline/bench/toy.py): header size limit (431), header
and body read timeouts (408), a client leaving mid-body (499), the drain at SIGTERM (503 / SSE error event
+ [DONE], each logged) and the keys file failing closed.

One Triton and one gateway for the module, with 1 s timeouts so the module stays short; the drain test is
last (it stops the gateway). The only timing assertions are "closed before the timeout + a margin".
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]
httpx = pytest.importorskip("httpx")

MODEL = "toy"
TIMEOUT_S = 1.0  # header_timeout_s, body_timeout_s and drain_timeout_s here
MARGIN_S = 4.0  # generous: 2 busy cores
EVERY_MS = 50  # the toy's time per token: a 200-token stream runs 10 s


@dataclass
class Gw:
    proc: object  # GatewayProcess
    url: str
    port: int
    key: str
    keys: Path
    root: Path

    def get(self, path: str, key: str | None = "main", **kw) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if key:
            headers["Authorization"] = f"Bearer {self.key if key == 'main' else key}"
        with httpx.Client(trust_env=False, timeout=30) as c:
            return c.request(kw.pop("method", "GET"), f"{self.url}{path}", headers=headers, **kw)

    def ready(self) -> None:
        resp = self.get("/health/ready", key=None)
        assert resp.status_code == 200, resp.text
        assert self.get("/v1/models").status_code == 200

    def log_lines(self) -> list[dict]:
        path = self.root / "access.log"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def line(self, request_id: str) -> dict:
        for _ in range(50):
            found = [x for x in self.log_lines() if x["request_id"] == request_id]
            if found:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError(f"no access-log line for {request_id}")

    def gateway_log(self) -> str:
        return (self.root / "gateway.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from pipeline.bench.toy import write_toy_repo
    from pipeline.demo import _train_tokenizer, corpus_text, paragraphs
    from pipeline.errors import LpxError
    from pipeline.gateway.api_keys import add_key
    from pipeline.gateway.process import GatewayProcess
    from pipeline.gateway.settings import GatewaySettings
    from pipeline.servers.tritonserver import TritonServer, find_tritonserver

    try:
        find_tritonserver()
    except LpxError as exc:
        pytest.skip(exc.message)
    root = tmp_path_factory.mktemp("gw-transport")
    _train_tokenizer(paragraphs(corpus_text()), vocab_size=512).save_pretrained(root / "tokenizer")
    # one slot: a second request waits at the engine while a stream runs (the drain's queued request)
    repo = write_toy_repo(root / "repo", first_ms=5, every_ms=EVERY_MS, first_id=100, id_span=50, slots=1)
    keys = root / "keys.json"
    secret = add_key(keys, "tests")[1]
    with TritonServer(repo, ready_timeout_s=180, log_path=root / "triton.log") as srv:
        settings = GatewaySettings(
            triton_url=srv.grpc_url,
            tokenizer=root / "tokenizer",
            model_name=MODEL,
            port=0,
            api_keys_file=keys,
            access_log=str(root / "access.log"),
            header_timeout_s=TIMEOUT_S,
            body_timeout_s=TIMEOUT_S,
            drain_timeout_s=TIMEOUT_S,
            max_body_bytes=64 * 1024,
        )
        proc = GatewayProcess(settings, root / "run", root / "gateway.log").start()
        try:
            yield Gw(proc, proc.url, proc.port, secret, keys, root)
        finally:
            proc.stop()


# -- raw sockets -------------------------------------------------------------------------------------
def connect(gw: Gw) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gw.port), timeout=TIMEOUT_S + MARGIN_S)


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send what the server still takes (it may close the connection in the middle)."""
    try:
        sock.sendall(data)
    except OSError:
        pass


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and when it closed (monotonic)."""
    out = b""
    while True:
        try:
            got = sock.recv(65536)
        except ConnectionResetError:
            got = b""
        if not got:
            return out, time.monotonic()
        out += got


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers, body


def openai_error(body: bytes, code: str) -> str:
    err = json.loads(body)["error"]
    assert err["code"] == code and set(err) == {"message", "type", "param", "code"}, err
    return err["message"]


def completion_head(gw: Gw, length: int, request_id: str, key: bool = True) -> bytes:
    auth = f"Authorization: Bearer {gw.key}\r\n" if key else ""
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {length}\r\nX-Request-Id: {request_id}\r\n\r\n"
    ).encode()


def completion_body(max_tokens: int = 2, pad: int = 0) -> bytes:
    body = {"model": MODEL, "prompt": "Bread is made" + " " * pad, "max_tokens": max_tokens}
    return json.dumps(body).encode()


# -- header size ---------------------------------------------------------------------------------------
def test_one_huge_header_gets_431_before_the_key(gw: Gw) -> None:
    """A 4 MiB header (no key): refused once past 16 KiB, not read to its end nor answered 401."""
    with connect(gw) as s:
        send_quietly(s, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        for _ in range(64):
            send_quietly(s, b"a" * 65536)
        status, headers, body = parse(read_until_closed(s)[0])
    assert status == 431 and headers["connection"] == "close"
    assert "16384 bytes" in openai_error(body, "headers_too_large")
    gw.ready()


def test_many_small_headers_adding_up_get_431(gw: Gw) -> None:
    lines = "".join(f"X-Small-{i}: {'v' * 50}\r\n" for i in range(300))  # about 19 KiB, each line short
    with connect(gw) as s:
        send_quietly(s, f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{lines}\r\n".encode())
        status, _, body = parse(read_until_closed(s)[0])
    assert status == 431
    openai_error(body, "headers_too_large")
    gw.ready()


def test_headers_just_under_the_limit_pass(gw: Gw) -> None:
    headers = {f"X-Small-{i}": "v" * 50 for i in range(200)}  # about 13 KiB
    resp = gw.get("/v1/models", headers=headers)
    assert resp.status_code == 200 and resp.json()["data"][0]["id"] == MODEL


# -- header time -------------------------------------------------------------------------------------
def test_headers_that_stop_coming_get_408_within_the_timeout(gw: Gw) -> None:
    with connect(gw) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        raw, closed = read_until_closed(s)
    status, headers, body = parse(raw)
    assert status == 408 and headers["connection"] == "close"
    assert "header_timeout_s" in openai_error(body, "header_timeout")
    assert closed - t0 < TIMEOUT_S + MARGIN_S
    gw.ready()


def test_trickled_headers_still_time_out(gw: Gw) -> None:
    """One byte every 0.2 s keeps no idle timer from firing: the headers' clock is a deadline."""
    closed_at: list[float] = []
    with connect(gw) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /v1/models HTTP/1.1\r\n")
        for _ in range(int((TIMEOUT_S + MARGIN_S) / 0.2)):
            try:
                s.sendall(b"X")
            except OSError:
                break
            time.sleep(0.2)
        raw, closed = read_until_closed(s)
        closed_at.append(closed)
    assert parse(raw)[0] == 408
    assert closed_at[0] - t0 < TIMEOUT_S + MARGIN_S + 0.5
    gw.ready()


def test_a_connection_that_sends_nothing_is_closed(gw: Gw) -> None:
    with connect(gw) as s:
        t0 = time.monotonic()
        raw, closed = read_until_closed(s)
    assert raw == b"" and closed - t0 < TIMEOUT_S + MARGIN_S


def test_a_kept_alive_connection_times_out_its_next_headers(gw: Gw) -> None:
    with connect(gw) as s:
        s.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        t0 = time.monotonic()
        s.sendall(b"GET /health/live HTTP/1.1\r\n")
        raw, closed = read_until_closed(s)
    assert parse(raw)[0] == 408 and closed - t0 < TIMEOUT_S + MARGIN_S
    gw.ready()


# -- body time ----------------------------------------------------------------------------------------
def test_a_body_that_stops_coming_gets_408_and_its_log_line(gw: Gw) -> None:
    body = completion_body()
    with connect(gw) as s:
        t0 = time.monotonic()
        s.sendall(completion_head(gw, len(body), "req-slow-body") + body[:10])
        raw, closed = read_until_closed(s)
    status, headers, answer = parse(raw)
    assert status == 408 and headers["x-request-id"] == "req-slow-body"
    assert "body_timeout_s" in openai_error(answer, "body_timeout")
    assert closed - t0 < TIMEOUT_S + MARGIN_S
    line = gw.line("req-slow-body")
    assert line["status"] == 408 and "body_timeout_s" in line["error"]
    gw.ready()


def test_a_body_sent_in_pieces_with_short_pauses_is_served(gw: Gw) -> None:
    """The body's timer is between reads: three pauses of half the timeout pass."""
    body = completion_body(pad=30)
    with connect(gw) as s:
        s.sendall(completion_head(gw, len(body), "req-paused-body"))
        for i in range(0, len(body), len(body) // 3 + 1):
            time.sleep(TIMEOUT_S / 2)
            s.sendall(body[i : i + len(body) // 3 + 1])
        s.settimeout(30)
        status, _, answer = parse(s.recv(65536))
    assert status == 200, answer
    assert gw.line("req-paused-body")["status"] == 200


def test_a_client_leaving_mid_body_is_logged_499(gw: Gw) -> None:
    body = completion_body()
    with connect(gw) as s:
        s.sendall(completion_head(gw, len(body), "req-left-mid-body") + body[:10])
        time.sleep(0.2)
    line = gw.line("req-left-mid-body")
    assert line["status"] == 499 and line["error"] == "client disconnected"
    gw.ready()


def test_a_refused_request_whose_body_never_ends_is_closed(gw: Gw) -> None:
    """401 is answered before the body is read; the connection is not held for the rest of it."""
    with connect(gw) as s:
        t0 = time.monotonic()
        s.sendall(completion_head(gw, 1000, "req-no-key-slow", key=False) + b'{"model"')
        raw, closed = read_until_closed(s)
    assert parse(raw)[0] == 401 and closed - t0 < TIMEOUT_S + MARGIN_S
    gw.ready()


def test_transport_refusals_are_counted(gw: Gw) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = gw.get("/metrics", key=None).text
    counts = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "lpx_gateway_connections_refused_total"
    }
    assert counts["headers_too_large"] >= 2 and counts["header_timeout"] >= 3, counts
    assert counts["body_timeout"] >= 1 and counts["idle"] >= 1, counts


# -- the keys file -------------------------------------------------------------------------------------
def _status_after_reload(gw: Gw, key: str | None = "main") -> httpx.Response:
    time.sleep(1.1)  # the ring looks at the file at most once a second
    return gw.get("/v1/models", key=key)


def test_a_removed_keys_file_fails_closed_and_says_so_once(gw: Gw) -> None:
    away = gw.keys.with_suffix(".away")
    os.replace(gw.keys, away)
    try:
        resp = _status_after_reload(gw)
        assert resp.status_code == 401 and "keys file" in openai_error(resp.content, "keys_unavailable")
        for _ in range(3):
            assert gw.get("/v1/models", key=None).status_code == 401
            assert gw.get("/v1/models", key="lpx-anything").status_code == 401
        assert gw.get("/health/ready", key=None).status_code == 200  # open routes stay open
        time.sleep(1.1)
        assert gw.get("/v1/models").status_code == 401
        said = [x for x in gw.gateway_log().splitlines() if str(gw.keys) in x and "is missing" in x]
        assert len(said) == 1, said
    finally:
        os.replace(away, gw.keys)
    assert _status_after_reload(gw).status_code == 200
    assert "is readable again" in gw.gateway_log()


def test_a_corrupt_keys_file_fails_closed_until_fixed(gw: Gw) -> None:
    good = gw.keys.read_bytes()
    gw.keys.write_text('{"keys": [')  # a hand edit that broke the JSON
    try:
        resp = _status_after_reload(gw)
        assert resp.status_code == 401
        openai_error(resp.content, "keys_unavailable")
        said = [
            x for x in gw.gateway_log().splitlines() if str(gw.keys) in x and "is not a valid keys file" in x
        ]
        assert len(said) == 1, said
    finally:
        tmp = gw.keys.with_suffix(".tmp")
        tmp.write_bytes(good)
        os.replace(tmp, gw.keys)
    assert _status_after_reload(gw).status_code == 200
    gw.ready()


# -- the drain (last: it stops the gateway) -------------------------------------------------------------
def _wait_in_flight(gw: Gw, n: int) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for _ in range(200):
        text = gw.get("/metrics", key=None).text
        for f in text_string_to_metric_families(text):
            if f.name == "lpx_gateway_requests_in_flight" and f.samples[0].value >= n:
                return
        time.sleep(0.05)
    raise AssertionError(f"never {n} requests in flight")


def test_drain_ends_a_stream_and_a_queued_request_each_logged(gw: Gw) -> None:
    """SIGTERM while a 10 s stream runs and a whole answer waits behind it at the one-slot engine: after
    drain_timeout_s the stream gets an SSE error event and [DONE], the waiting request a 503 in OpenAI's
    shape, each has its access-log line, and the gateway exits 0."""
    auth = {"Authorization": f"Bearer {gw.key}", "X-Request-Id": "req-drain-stream"}
    stream_body = {"model": MODEL, "prompt": "Bread", "max_tokens": 200, "stream": True}
    queued: dict = {}

    def whole() -> None:
        headers = {"Authorization": f"Bearer {gw.key}", "X-Request-Id": "req-drain-queued"}
        body = {"model": MODEL, "prompt": "Bread", "max_tokens": 5}
        with httpx.Client(trust_env=False, timeout=60) as c:
            r = c.post(f"{gw.url}/v1/completions", json=body, headers=headers)
            queued.update(status=r.status_code, body=r.content, type=r.headers.get("content-type"))

    events: list[str] = []
    with httpx.Client(trust_env=False, timeout=60) as client:
        with client.stream("POST", f"{gw.url}/v1/completions", json=stream_body, headers=auth) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            events.append(next(x for x in lines if x.startswith("data: ")))
            waiter = threading.Thread(target=whole)
            waiter.start()
            _wait_in_flight(gw, 2)  # the whole answer now waits for the engine's one slot
            gw.proc.proc.send_signal(15)
            t0 = time.monotonic()
            events += [x for x in lines if x.startswith("data: ")]
            ended = time.monotonic()
    waiter.join(timeout=30)
    assert ended - t0 < TIMEOUT_S + MARGIN_S
    assert events[-1] == "data: [DONE]" and len(events) < 200, events[-3:]
    err = json.loads(events[-2].removeprefix("data: "))["error"]
    assert err["code"] == "server_shutting_down" and "drain_timeout_s" in err["message"]
    assert queued["status"] == 503 and queued["type"] == "application/json", queued
    openai_error(queued["body"], "server_shutting_down")
    code = gw.proc.proc.wait(timeout=30)
    assert code == 0
    stream_line, queued_line = gw.line("req-drain-stream"), gw.line("req-drain-queued")
    assert stream_line["status"] == 200 and "drain" in stream_line["error"] and stream_line["stream"] is True
    assert stream_line["completion_tokens"] >= 1
    assert queued_line["status"] == 503 and "drain" in queued_line["error"]
    assert "Internal Server Error" not in gw.gateway_log()
