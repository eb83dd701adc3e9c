"""The two Triton senders of `lpx bench` (load.py drives them): gRPC `ModelStreamInfer` on a grpc.aio
channel, one short bidirectional stream per request, and HTTP `generate_stream` with aiohttp. Each fills
one Record per request (first-token and per-token times, counts the server reports, the error)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: load.py imports this module when it picks a sender
    from .load import LoadSpec, Record

try:
    from grpc.aio import EOF as grpc_aio_EOF
except ImportError:  # grpc is only needed for --protocol grpc
    grpc_aio_EOF = None


def _bytes_tensor(arr: np.ndarray) -> bytes:
    return b"".join(
        len(b).to_bytes(4, "little") + b
        for b in (x if isinstance(x, bytes) else str(x).encode() for x in arr.reshape(-1))
    )


class GrpcSender:
    def __init__(self, spec: LoadSpec):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self.pb = service_pb2
        self.channel = grpc.aio.insecure_channel(
            spec.url, options=[("grpc.max_receive_message_length", 2**31 - 1), ("grpc.enable_http_proxy", 0)]
        )
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.spec = spec

    def request(self, tensors: dict[str, tuple[str, np.ndarray]]) -> Any:
        req = self.pb.ModelInferRequest(model_name=self.spec.model)
        for name, (dtype, arr) in tensors.items():
            req.inputs.add(name=name, datatype=dtype, shape=list(arr.shape))
            req.raw_input_contents.append(_bytes_tensor(arr) if dtype == "BYTES" else arr.tobytes())
        # an empty final response marks the end even when the model's last response carried tokens
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        return req

    async def send(self, req: Any, rec: Record) -> None:
        call = self.stub.ModelStreamInfer(timeout=self.spec.timeout_s)
        rec.sent, rec.sent_ns = time.perf_counter(), time.time_ns()
        await call.write(req)
        while (msg := await call.read()) is not grpc_aio_EOF:
            t = time.perf_counter()
            if msg.error_message:
                raise RuntimeError(msg.error_message)
            resp = msg.infer_response
            counted = _int_output(resp, "num_input_tokens")
            if counted is not None:
                rec.input_tokens, rec.input_counted_by = counted, "num_input_tokens"
            n = _count_grpc(resp)
            if n:
                rec.times.append(t)
                rec.tokens.append(n)
                emit = _emit_grpc(resp)
                if emit is not None:
                    rec.emits_ns.append(emit)
            if resp.parameters["triton_final_response"].bool_param:
                await call.done_writing()
                return
        raise RuntimeError("stream ended without a final response")

    async def close(self) -> None:
        await self.channel.close()


def _count_grpc(resp: Any) -> int:
    """Output tokens in one response: the server's num_output_tokens, else the length of `output_ids`,
    else 1 for a non-empty text response."""
    for i, out in enumerate(resp.outputs):
        if out.name == "num_output_tokens" and len(resp.raw_output_contents[i]) >= 4:
            return int.from_bytes(resp.raw_output_contents[i][:4], "little", signed=True)
    for i, out in enumerate(resp.outputs):
        if out.name == "output_ids":
            return len(resp.raw_output_contents[i]) // 4  # INT32 [beams=1, new tokens]
    for i, out in enumerate(resp.outputs):
        if out.name == "text_output" and len(resp.raw_output_contents[i]) > 4:
            return 1
    return 0


def _int_output(resp: Any, name: str) -> int | None:
    """An INT32 scalar output of one gRPC response, None when the response lacks it."""
    for i, out in enumerate(resp.outputs):
        if out.name == name and len(resp.raw_output_contents[i]) >= 4:
            return int.from_bytes(resp.raw_output_contents[i][:4], "little", signed=True)
    return None


def _emit_grpc(resp: Any) -> int | None:
    """The optional `emit_ns` INT64 output (server wall clock at send), as the toy engine stamps it."""
    for i, out in enumerate(resp.outputs):
        if out.name == "emit_ns" and len(resp.raw_output_contents[i]) >= 8:
            return int.from_bytes(resp.raw_output_contents[i][:8], "little", signed=True)
    return None


def http_session(timeout_s: float, headers: dict[str, str] | None = None) -> Any:
    """The aiohttp session of an HTTP sender: no connection limit, no proxy from the environment."""
    import aiohttp

    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        trust_env=False,
        connector=aiohttp.TCPConnector(limit=0),
        headers=headers,
    )


async def sse_events(session: Any, url: str, **post: Any) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    """Each `data:` event of a streamed POST as (its arrival time, the parsed JSON), up to `[DONE]` or the
    end of the stream; an answer other than 200 raises with its text. Use under contextlib.aclosing, so
    a consumer that stops early releases the connection at once."""
    async with session.post(url, **post) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return
            t = time.perf_counter()
            yield t, json.loads(payload)


class HttpSender:
    def __init__(self, spec: LoadSpec):
        self.spec = spec
        self.session = http_session(spec.timeout_s)
        base = spec.url if spec.url.startswith(("http://", "https://")) else f"http://{spec.url}"
        self.endpoint = f"{base}/v2/models/{spec.model}/generate_stream"

    def request(self, tensors: dict[str, tuple[str, np.ndarray]]) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for name, (dtype, arr) in tensors.items():
            flat = arr.reshape(-1)
            if dtype == "BYTES":
                body[name] = flat[0].decode()
            else:
                body[name] = flat.tolist() if flat.size > 1 else flat[0].item()
        return body

    async def send(self, body: dict[str, Any], rec: Record) -> None:
        rec.sent, rec.sent_ns = time.perf_counter(), time.time_ns()
        async with contextlib.aclosing(sse_events(self.session, self.endpoint, json=body)) as events:
            async for t, event in events:
                if "error" in event:
                    raise RuntimeError(str(event["error"]))
                if event.get("num_input_tokens") is not None:
                    rec.input_tokens = int(np.asarray(event["num_input_tokens"]).reshape(-1)[0])
                    rec.input_counted_by = "num_input_tokens"
                counted, ids = event.get("num_output_tokens"), event.get("output_ids")
                if counted is not None:
                    n = int(np.asarray(counted).reshape(-1)[0])
                else:
                    n = int(np.size(ids)) if ids is not None else int(bool(event.get("text_output")))
                if n:
                    rec.times.append(t)
                    rec.tokens.append(n)
                    emit = event.get("emit_ns")
                    if emit is not None:
                        rec.emits_ns.append(int(np.asarray(emit).reshape(-1)[0]))

    async def close(self) -> None:
        await self.session.close()
