"""The clients and helpers of scripts/bench_gateway.py and scripts/bench_gateway_ab.py: a streamed gRPC
request to a Triton model (as a bidirectional stream, tritonclient's way, or as the one-message
server-streaming call the gateway makes), a streamed /v1/completions over aiohttp, TTFT rounds and their
tables, a closed-loop driver, and a bare uvicorn SSE endpoint as the floor of HTTP on this machine.
"""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q * 100))


# -- clients ---------------------------------------------------------------------------------------
def _has_output(resp) -> bool:
    """A response carrying tokens: output_ids (INT32, 4 bytes each) or text (BYTES: 4-byte length + text)."""
    for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=False):
        if (out.name == "output_ids" and len(raw) >= 4) or (out.name == "text_output" and len(raw) > 4):
            return True
    return False


class TritonPath:
    """One streamed request to a Triton model over grpc.aio; TTFT = first response carrying output.
    `unary`: the request as a server-streaming call (sent with the call's start and half-close, as the
    gateway does), else a bidirectional stream with an awaited write (tritonclient's way)."""

    def __init__(self, url: str, model: str, arrays: dict[str, np.ndarray], unary: bool = False) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        from .senders import _bytes_tensor

        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.enable_http_proxy", 0)])
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.unary = unary
        self.one_message = self.channel.unary_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        self.req = service_pb2.ModelInferRequest(model_name=model)
        kinds = {"object": "BYTES", "int32": "INT32", "bool": "BOOL", "float32": "FP32"}
        for name, arr in arrays.items():
            kind = kinds[arr.dtype.name]
            self.req.inputs.add(name=name, datatype=kind, shape=list(arr.shape))
            self.req.raw_input_contents.append(_bytes_tensor(arr) if kind == "BYTES" else arr.tobytes())
        self.req.parameters["triton_enable_empty_final_response"].bool_param = True

    async def _call(self):
        if self.unary:
            return self.one_message(self.req)
        call = self.stub.ModelStreamInfer()
        await call.write(self.req)
        return call

    async def ttft(self) -> float:
        from grpc.aio import EOF

        t0 = time.perf_counter()
        first = None
        call = await self._call()
        while (msg := await call.read()) is not EOF:
            if msg.error_message:
                raise RuntimeError(msg.error_message)
            resp = msg.infer_response
            if first is None and _has_output(resp):
                first = time.perf_counter() - t0
            if resp.parameters["triton_final_response"].bool_param:
                if not self.unary:
                    await call.done_writing()
                break
        if first is None:
            raise RuntimeError("no output")
        return first

    async def count_tokens(self) -> int:
        """A whole streamed answer read as it comes; its tokens (output_ids of every response)."""
        from grpc.aio import EOF

        tokens = 0
        call = await self._call()
        while (msg := await call.read()) is not EOF:
            resp = msg.infer_response
            for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=False):
                if out.name == "output_ids":
                    tokens += len(raw) // 4
            if resp.parameters["triton_final_response"].bool_param:
                if not self.unary:
                    await call.done_writing()
                break
        return tokens

    async def close(self) -> None:
        await self.channel.close()


class GatewayPath:
    """One streamed /v1/completions; TTFT = the first SSE chunk (it carries text)."""

    def __init__(self, url: str, body: dict) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(trust_env=False, connector=aiohttp.TCPConnector(limit=0))
        self.url, self.body = f"{url}/v1/completions", json.dumps(body).encode()

    async def _lines(self):
        """The SSE lines of one streamed request, as they arrive."""
        async with self.session.post(
            self.url, data=self.body, headers={"Content-Type": "application/json"}
        ) as r:
            if r.status != 200:
                raise RuntimeError(await r.text())
            async for line in r.content:
                yield line

    async def ttft(self) -> float:
        t0 = time.perf_counter()
        first = None
        async for line in self._lines():
            if line.startswith(b"data:") and first is None:
                first = time.perf_counter() - t0
        assert first is not None
        return first

    async def stream_tokens(self) -> int:
        """A whole streamed answer; its tokens as usage reports them."""
        tokens = 0
        async for line in self._lines():
            if line.startswith(b"data: {") and b'"choices":[]' in line:  # the usage chunk
                tokens = json.loads(line[5:])["usage"]["completion_tokens"]
        return tokens

    async def close(self) -> None:
        await self.session.close()


async def ttfts(paths: dict, rounds: int, warmup: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in paths}
    for i in range(warmup + rounds):
        for name, path in paths.items():
            t = await path.ttft()
            if i >= warmup:
                out[name].append(t)
    return out


def table(samples: dict[str, list[float]], base: str) -> dict:
    b50, b90 = pct(samples[base], 0.5), pct(samples[base], 0.9)
    rows = {}
    for name, xs in samples.items():
        p50, p90 = pct(xs, 0.5), pct(xs, 0.9)
        paired = [x - b for x, b in zip(xs, samples[base], strict=True)]  # same round, one after the other
        rows[name] = {
            "ttft_p50_ms": p50 * 1e3,
            "ttft_p90_ms": p90 * 1e3,
            "added_p50_ms": (p50 - b50) * 1e3,
            "added_p90_ms": (p90 - b90) * 1e3,
            "paired_added_median_ms": pct(paired, 0.5) * 1e3,
            "n": len(xs),
        }
    return rows


def show(title: str, rows: dict) -> None:
    print(f"\n{title}")
    print(
        f"{'path':<22}{'TTFT p50 ms':>12}{'p90 ms':>9}{'added p50':>11}{'added p90':>11}{'paired median':>15}"
    )
    for name, r in rows.items():
        print(
            f"{name:<22}{r['ttft_p50_ms']:>12.3f}{r['ttft_p90_ms']:>9.3f}{r['added_p50_ms']:>11.3f}"
            f"{r['added_p90_ms']:>11.3f}{r['paired_added_median_ms']:>15.3f}"
        )


async def gather_limited(fn, n: int, concurrency: int) -> list[int]:
    """`n` calls of `fn` with `concurrency` always in flight (closed loop); their results."""
    left, out = [n], []

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            out.append(await fn())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def bare_sse_app(scope: dict, receive, send) -> None:
    """The least an HTTP server can do for a streamed answer: read the body, send one event and [DONE]."""
    if scope["type"] != "http":
        return
    await receive()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.run(
        bare_sse_app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning"
    )


def http_floor(rounds: int, warmup: int) -> dict:
    """TTFT of a bare uvicorn SSE endpoint (same server stack and client as the gateway, no work): what
    HTTP alone costs on this machine."""
    import multiprocessing
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = multiprocessing.get_context("spawn").Process(target=_serve_bare, args=(port,), daemon=True)
    proc.start()
    try:

        async def run() -> list[float]:
            path = GatewayPath(f"http://127.0.0.1:{port}", {})
            try:
                for _ in range(100):
                    try:
                        await path.ttft()
                        break
                    except OSError:
                        await asyncio.sleep(0.1)
                return (await ttfts({"bare": path}, rounds, warmup))["bare"]
            finally:
                await path.close()

        xs = asyncio.run(run())
    finally:
        proc.terminate()
        proc.join(5)
    return {"ttft_p50_ms": pct(xs, 0.5) * 1e3, "ttft_p90_ms": pct(xs, 0.9) * 1e3, "n": len(xs)}
