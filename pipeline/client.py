"""Stream text from a Triton `ensemble` over gRPC (bidirectional stream) or HTTP (generate_stream SSE).

Request tensors follow upstream's ensemble: `text_input` BYTES, `max_tokens` INT32, `stream` BOOL,
plus optional sampling inputs only when given; the response tensor is `text_output` BYTES.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import LpxError
from .runtime.tensors import triton_dtype
from .runtime.validate import INT32_MAX

START_HINT = "is the server running? start it with 'lpx serve'"
NP_TYPES = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_, "BYTES": np.object_}


@dataclass
class Chunk:
    text: str
    t: float  # time.perf_counter() when received
    token_ids: list[int] | None = None


@dataclass
class Result:
    text: str
    ttft_s: float
    total_s: float
    chunks: int
    tokens_per_s: float


def _dtype(model: str, name: str, value: Any) -> str:
    """The datatype the model declares for `name` (LPX's tensor table), else inferred from the value."""
    declared = triton_dtype(model, name)
    if declared:
        return declared
    sample = value[0] if isinstance(value, list | tuple) and value else value
    if isinstance(sample, bool):
        return "BOOL"
    if isinstance(sample, int):
        return "INT32"
    if isinstance(sample, float):
        return "FP32"
    return "BYTES"


def _array(dtype: str, value: Any) -> np.ndarray:
    """[1, 1] for a scalar, [1, n] for a list (stop_words, bad_words): batch of one request."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    items = [v.encode() if isinstance(v, str) else v for v in items]
    return np.array([items], dtype=NP_TYPES[dtype])


def _inputs(model: str, prompt: str, max_tokens: int, params: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    if not 1 <= int(max_tokens) <= INT32_MAX:  # sent as INT32 (upstream's type): a larger value would wrap
        raise LpxError(
            f"max_tokens {max_tokens} cannot be sent: allowed 1..{INT32_MAX} - ask for fewer tokens"
        )
    values = {"text_input": prompt, "max_tokens": int(max_tokens), "stream": True}
    values.update({k: v for k, v in params.items() if v is not None})
    return {k: (_dtype(model, k, v), v) for k, v in values.items()}


def _loopback(url: str) -> bool:
    """A server on this machine: reach it directly even when http_proxy/grpc_proxy are set."""
    host = url.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _decode(arr: np.ndarray | None) -> str:
    if arr is None:
        return ""
    return "".join(x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in arr.reshape(-1))


def generate_stream(
    url: str,
    prompt: str,
    max_tokens: int,
    model: str = "ensemble",
    protocol: str = "grpc",
    timeout_s: float = 600.0,
    **params: Any,
) -> Iterator[Chunk]:
    """Yield text chunks as the server produces them; LpxError on any server or connection error."""
    if protocol == "grpc":
        return _grpc_stream(url, prompt, max_tokens, model, timeout_s, params)
    if protocol == "http":
        return _http_stream(url, prompt, max_tokens, model, timeout_s, params)
    raise LpxError(f"Unknown protocol {protocol!r} - use 'grpc' or 'http'")


def generate(url: str, prompt: str, max_tokens: int, **options: Any) -> Result:
    """Collect generate_stream(url, prompt, max_tokens, **options): text, time to first chunk, total time,
    chunk count, chunks/s after the first."""
    t0 = time.perf_counter()
    parts: list[str] = []
    times: list[float] = []
    for chunk in generate_stream(url, prompt, max_tokens, **options):
        parts.append(chunk.text)
        times.append(chunk.t)
    end = time.perf_counter()
    ttft = (times[0] - t0) if times else end - t0
    after = (times[-1] - times[0]) if len(times) > 1 else 0.0
    tps = (len(times) - 1) / after if after > 0 else 0.0
    return Result("".join(parts), ttft, end - t0, len(times), tps)


# -- gRPC -------------------------------------------------------------------------------------------
def _grpc_error(url: str, model: str, err: Exception) -> LpxError:
    msg = str(err)
    status = getattr(err, "status", lambda: None)()
    if (
        "UNAVAILABLE" in str(status)
        or "failed to connect" in msg.lower()
        or "connection refused" in msg.lower()
    ):
        return LpxError(f"Cannot reach Triton gRPC at {url} - {START_HINT}", detail=msg)
    return LpxError(
        f"Triton refused the request to model '{model}' at {url}: {msg} - "
        "check the model name and its inputs ('lpx repo' writes the repository)",
        detail=msg,
    )


def _grpc_stream(
    url: str, prompt: str, max_tokens: int, model: str, timeout_s: float, params: dict[str, Any]
) -> Iterator[Chunk]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = []
    for name, (dtype, value) in _inputs(model, prompt, max_tokens, params).items():
        arr = _array(dtype, value)
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    outputs: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
    size = 2**31 - 1
    direct = [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        ("grpc.enable_http_proxy", 0),
    ]
    client = grpcclient.InferenceServerClient(url, channel_args=direct if _loopback(url) else None)
    done = False
    try:
        client.start_stream(callback=lambda result, error: outputs.put((time.perf_counter(), result, error)))
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            try:
                t, result, error = outputs.get(timeout=timeout_s)
            except queue.Empty:
                raise LpxError(
                    f"No response from {url} for {timeout_s:.0f} s - "
                    "check the server's log or raise the timeout"
                ) from None
            if error is not None:
                raise _grpc_error(url, model, error)
            text = _decode(result.as_numpy("text_output"))
            ids = result.as_numpy("output_ids")
            if text or ids is not None:
                yield Chunk(text, t, ids.reshape(-1).tolist() if ids is not None else None)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                done = True
                return
    except InferenceServerException as e:  # a broken stream reports its reason through the callback
        raise _grpc_error(url, model, _first_error(outputs) or e) from None
    finally:
        try:
            # Cancel only an unfinished request: cancelling a finished one sometimes leaves the
            # python backend model "live" at shutdown, so SIGTERM waits the whole exit timeout.
            client.stop_stream(cancel_requests=not done)
        finally:
            client.close()


def _first_error(outputs: queue.Queue[tuple[float, Any, Any]], wait_s: float = 2.0) -> Exception | None:
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            _, _, error = outputs.get(timeout=left)
        except queue.Empty:
            return None
        if error is not None:
            return error
    return None


# -- HTTP -------------------------------------------------------------------------------------------
def _http_stream(
    url: str, prompt: str, max_tokens: int, model: str, timeout_s: float, params: dict[str, Any]
) -> Iterator[Chunk]:
    import requests

    base = url if url.startswith(("http://", "https://")) else f"http://{url}"
    body = {k: v for k, (_, v) in _inputs(model, prompt, max_tokens, params).items()}
    # One connection per request, closed by the server when done: a connection kept alive (even by
    # a traceback that references it) stops Triton from draining on SIGTERM until its exit timeout.
    with requests.Session() as session:
        session.trust_env = not _loopback(url)
        try:
            resp = session.post(
                f"{base}/v2/models/{model}/generate_stream",
                json=body,
                stream=True,
                timeout=(10, timeout_s),
                headers={"Connection": "close"},
            )
        except requests.ConnectionError as e:
            raise LpxError(f"Cannot reach Triton HTTP at {url} - {START_HINT}", detail=str(e)) from None
        except requests.Timeout as e:
            raise LpxError(
                f"No response from {url} for {timeout_s:.0f} s - check the server's log", detail=str(e)
            ) from None
        with resp:
            yield from _sse_chunks(resp, url, model)


def _sse_chunks(resp: Any, url: str, model: str) -> Iterator[Chunk]:
    import requests

    if resp.status_code != 200:
        try:
            msg = resp.json().get("error", resp.text)
        except ValueError:
            msg = resp.text
        raise LpxError(
            f"Triton refused the request to model '{model}' at {url} (HTTP {resp.status_code}): "
            f"{msg} - check the model name and its inputs",
            detail=msg,
        )
    try:
        for line in resp.iter_lines(decode_unicode=False):
            if not line.startswith(b"data:"):
                continue
            t = time.perf_counter()
            event = json.loads(line[5:])
            if "error" in event:
                raise LpxError(
                    f"Triton failed the request to model '{model}' at {url}: {event['error']}",
                    detail=str(event["error"]),
                )
            text = event.get("text_output", "")
            text = "".join(text) if isinstance(text, list) else str(text)
            ids = event.get("output_ids")
            if text or ids is not None:
                yield Chunk(text, t, list(np.ravel(ids).tolist()) if ids is not None else None)
    except requests.RequestException as e:
        raise LpxError(f"Stream from {url} broke off - {START_HINT}", detail=str(e)) from None


# -- OpenAI-compatible servers (LPX's gateway) -------------------------------------------------------
def openai_stream(
    url: str,
    prompt: str,
    max_tokens: int,
    model: str | None = None,
    chat: bool = False,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    **params: Any,
) -> Iterator[Chunk]:
    """Stream /v1/completions (or /v1/chat/completions with the prompt as one user message) from an
    OpenAI-compatible server at `url` (http://host:port); LpxError on any error, in the server's words."""
    import requests

    base = base_url(url)
    model = model or served_model(base, api_key)
    body: dict[str, Any] = {"model": model, "max_tokens": int(max_tokens), "stream": True}
    body.update({k: v for k, v in params.items() if v is not None})
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    route = "/v1/chat/completions" if chat else "/v1/completions"
    with requests.Session() as session:
        session.trust_env = not _loopback(base)
        try:
            resp = session.post(
                base + route, json=body, headers=headers, stream=True, timeout=(10, timeout_s)
            )
        except requests.RequestException as e:
            raise LpxError(f"Cannot reach the OpenAI API at {base} - {START_HINT}", detail=str(e)) from None
        with resp:
            if resp.status_code != 200:
                try:
                    msg = resp.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    msg = resp.text[:300]
                raise LpxError(f"The server at {base} refused the request (HTTP {resp.status_code}): {msg}")
            for line in resp.iter_lines(decode_unicode=False):
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise LpxError(
                        f"The server at {base} failed the request: {event['error'].get('message')}"
                    )
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if text:
                        yield Chunk(text, time.perf_counter())


# OpenAI-compatible servers (LPX's gateway, vLLM, trtllm-serve): where, with which key, which model
def base_url(url: str) -> str:
    url = url if url.startswith(("http://", "https://")) else f"http://{url}"
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def api_key(given: str | None) -> str | None:
    return given or os.environ.get("LPX_API_KEY") or os.environ.get("OPENAI_API_KEY")


def served_model(url: str, key: str | None, timeout_s: float = 10.0) -> str:
    """The first model id GET /v1/models lists."""
    import requests

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with requests.Session() as session:
            session.trust_env = False
            resp = session.get(f"{base_url(url)}/v1/models", headers=headers, timeout=timeout_s)
    except requests.RequestException as exc:
        raise LpxError(
            f"Cannot reach an OpenAI-compatible server at {url} - is it running?", str(exc)
        ) from None
    if resp.status_code != 200:
        raise LpxError(
            f"GET {base_url(url)}/v1/models answered {resp.status_code}: {resp.text[:300]} - check --api-key"
        )
    data = resp.json().get("data") or []
    if not data:
        raise LpxError(f"{url} serves no model - pass --model NAME")
    return str(data[0]["id"])
