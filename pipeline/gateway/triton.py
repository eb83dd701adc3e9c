"""The gateway's side of Triton: one gRPC channel (grpc.aio, the messages tritonclient ships), the
`tensorrt_llm` model's interface read from the server, and one `ModelStreamInfer` call per request.

The call is made as a server-streaming one: the request message goes out with the call's start and the
client's half-close in one batch (no separate awaited write), and Triton streams the request's responses
until its final one, as it does for any stream whose client has stopped writing (tritonclient's own
`stop_stream` relies on that). On the wire it is the same RPC; it saves an awaited write, 0.2-0.4 ms of
TTFT on the development machine (docs/gateway.md, Measured).

Requests go straight to `tensorrt_llm` with token ids (upstream's tensor names and types, as the
model's metadata declares them), streaming on, and come back as token ids: no preprocessing,
postprocessing, ensemble or BLS hop. Only inputs the model declares are sent, so the same gateway
drives the torch and llmapi targets' python models, the engine target's C++ backend and a toy model.
Closing a request's stream (client gone, stop sequence seen, timeout) cancels the call: Triton marks the
request cancelled and the engine stops generating it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .. import trace
from ..runtime.limits import Limits

ENGINE = "tensorrt_llm"
PACK = {"INT32": "<i", "FP32": "<f", "UINT64": "<Q", "INT64": "<q", "BOOL": "<?"}
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.enable_http_proxy", 0),
]


WANTED = ("output_ids", "num_input_tokens", "output_log_probs", "top_log_probs", "top_log_prob_ids")
# LPX's extension of its python models' `tensorrt_llm` (pipeline/runtime/tensors.py): k alternatives per
# generated token, asked with TOP_INPUT = k and returned as [1, tokens, k] log probs and ids
TOP_INPUT = "top_log_probs_k"
TOP_OUTPUTS = ("top_log_probs", "top_log_prob_ids")


def _raw(dtype: str, value: Any) -> bytes:
    """One element as Triton's raw input bytes (BYTES: a little-endian uint32 length, then the bytes)."""
    if dtype == "BYTES":
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return struct.pack("<I", len(data)) + data
    return struct.pack(PACK[dtype], value)


class EngineError(Exception):
    """Triton or the engine refused or failed a request; `invalid`: the request's fault (400)."""

    def __init__(self, message: str, invalid: bool) -> None:
        super().__init__(message)
        self.message = message
        self.invalid = invalid


@dataclass
class ModelInfo:
    """What the served `tensorrt_llm` takes and returns, and the limits LPX's repository records."""

    inputs: dict[str, str]  # name -> datatype ("INT32", ...)
    outputs: set[str]
    max_input_len: int = 0  # 0: unknown
    max_seq_len: int = 0
    max_tokens_cap: int = 0
    params: dict[str, dict[str, str]] = field(default_factory=dict)
    backend: str = ""  # the model config's backend ("python": LPX's torch / llmapi models)

    @property
    def limits(self) -> Limits:
        """The limits as the checks take them (pipeline/runtime/limits.py)."""
        return Limits(
            max_input_len=self.max_input_len, max_seq_len=self.max_seq_len, max_tokens_cap=self.max_tokens_cap
        )

    @property
    def log_probs(self) -> bool:
        return "output_log_probs" in self.outputs and "return_log_probs" in self.inputs

    @property
    def top_log_probs(self) -> bool:
        return TOP_INPUT in self.inputs and all(name in self.outputs for name in TOP_OUTPUTS)

    @property
    def target(self) -> str:
        """The served target in words, for messages."""
        return "the engine target's C++ backend" if self.backend == "tensorrtllm" else self.backend or "?"


@dataclass
class Delta:
    """One engine response: new token ids (and their log probabilities when asked), final or not."""

    ids: list[int]
    final: bool
    logprobs: list[float] | None = None
    num_input_tokens: int | None = None
    top: list[list[tuple[int, float]]] | None = None  # per token: k (id, log prob), best first


def _params(config: dict[str, Any]) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}


def _int(params: dict[str, str], key: str) -> int:
    try:
        return int(params.get(key) or 0)
    except ValueError:
        return 0


# Phrases of the refusals LPX's models and Triton answer with INVALID_ARG; a stream's error carries only
# its text, so these tell a bad request (400) from a failure (500).
INVALID_HINTS = (
    "is not supported",
    "not supported by",
    "is missing",
    "must be",
    "outside",
    "unexpected inference input",
    "above the engine",
    "exceeds",
    "refused",
    "invalid",
    " - send ",
    " - leave ",
    " - lower ",
    " - shorten ",
)


class Triton:
    """The gRPC channel to Triton; `info()` reads the model once it is ready."""

    def __init__(self, url: str, model: str = ENGINE, timeout_s: float = 600.0) -> None:
        import grpc
        import tritonclient.grpc.aio as aio
        from tritonclient.grpc import service_pb2

        self.url, self.model, self.timeout_s = url, model, timeout_s
        self.pb = service_pb2
        self.admin = aio.InferenceServerClient(url, channel_args=CHANNEL_OPTIONS)
        self.channel = grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS)
        self._infer = self.channel.unary_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        self._info: ModelInfo | None = None
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        await self.admin.close()
        await self.channel.close()

    async def ready(self) -> tuple[bool, str]:
        """(Triton ready and the model ready, why not)."""
        try:
            if not await self.admin.is_server_ready(client_timeout=2):
                return False, f"Triton at {self.url} is not ready"
            if not await self.admin.is_model_ready(self.model, client_timeout=2):
                return False, f"model '{self.model}' is not ready on Triton at {self.url}"
        except Exception as exc:
            return False, f"Triton at {self.url} does not answer ({_first_line(exc)})"
        return True, ""

    async def info(self) -> ModelInfo:
        """The model's declared tensors and limits (read once; the limits from LPX's repository parameters:
        preprocessing's max_input_len / max_seq_len / max_tokens_cap, else tensorrt_llm's - the one place
        the gateway's limits come from, the ones the engine enforces)."""
        if self._info is not None:
            return self._info
        async with self._lock:
            if self._info is None:
                meta = await self.admin.get_model_metadata(self.model, as_json=True, client_timeout=5)
                config = (await self.admin.get_model_config(self.model, as_json=True, client_timeout=5))[
                    "config"
                ]
                params = {self.model: _params(config)}
                try:
                    pre = await self.admin.get_model_config("preprocessing", as_json=True, client_timeout=5)
                    params["preprocessing"] = _params(pre["config"])
                except Exception:
                    params["preprocessing"] = {}
                pick = lambda key: _int(params["preprocessing"], key) or _int(params[self.model], key)  # noqa: E731
                info = ModelInfo(
                    inputs={t["name"]: t["datatype"] for t in meta.get("inputs", [])},
                    outputs={t["name"] for t in meta.get("outputs", [])},
                    max_input_len=pick("max_input_len"),
                    max_seq_len=pick("max_seq_len"),
                    max_tokens_cap=pick("max_tokens_cap"),
                    params=params,
                    backend=str(config.get("backend") or ""),
                )
                self._info = info
        return self._info

    def request(self, info: ModelInfo, ids: list[int], values: dict[str, Any], request_id: str) -> Any:
        """A ModelInferRequest: input_ids [1, n] and each given value [1, 1], typed as the model declares
        (values the model does not declare are left out: the caller refuses non-defaults beforehand)."""
        req = self.pb.ModelInferRequest(model_name=self.model, id=request_id)
        req.inputs.add(name="input_ids", datatype="INT32", shape=[1, len(ids)])
        req.raw_input_contents.append(struct.pack(f"<{len(ids)}i", *ids))
        for name, value in values.items():
            dtype = info.inputs.get(name)
            if dtype is None or value is None:
                continue
            req.inputs.add(name=name, datatype=dtype, shape=[1, 1])
            req.raw_input_contents.append(_raw(dtype, value))
        # only the outputs read here (an engine's other outputs would be sent and parsed for nothing)
        for name in WANTED:
            if name == "output_log_probs" and not values.get("return_log_probs"):
                continue
            if name in TOP_OUTPUTS and not values.get(TOP_INPUT):
                continue
            if name in info.outputs:
                req.outputs.add(name=name)
        # the final flag always comes, also after an engine's empty final response (a cancelled request)
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        return req

    async def stream(self, req: Any, timeout_s: float | None = None) -> AsyncIterator[Delta]:
        """The responses of one request; leaving the loop early (or being cancelled) cancels the call,
        and so does its deadline (`timeout_s`)."""
        from grpc.aio import EOF

        if trace.ON:  # the request's path: the gateway hands it to Triton
            trace.mark("request", at="gateway", tid=req.id)
        call = self._infer(req, timeout=timeout_s or self.timeout_s)
        finished = False
        got = 0  # tokens so far (the trace's join key)
        try:
            while True:
                msg = await call.read()
                if msg is EOF:
                    raise EngineError("Triton closed the stream before the final response", invalid=False)
                if msg.error_message:
                    raise EngineError(msg.error_message, invalid=_invalid(msg.error_message))
                delta = _delta(msg.infer_response)
                if trace.ON:
                    got += len(delta.ids)
                    trace.mark("gateway", id=req.id, n=got)
                finished = delta.final
                yield delta
                if finished:
                    return
        except EngineError:
            raise
        except Exception as exc:
            import grpc

            if isinstance(exc, grpc.aio.AioRpcError):
                raise EngineError(
                    f"Triton at {self.url} failed the request: {exc.code().name} {exc.details()}",
                    invalid=exc.code() == grpc.StatusCode.INVALID_ARGUMENT,
                ) from None
            raise
        finally:
            if not finished:
                call.cancel()


def _invalid(message: str) -> bool:
    low = message.lower()
    return any(h in low for h in INVALID_HINTS)


def _delta(resp: Any) -> Delta:
    ids: list[int] = []
    logprobs = top_lp = top_ids = None
    n_in = None
    for i, out in enumerate(resp.outputs):
        name = out.name
        if name == "output_ids":
            ids = memoryview(resp.raw_output_contents[i]).cast("i").tolist()
        elif name == "output_log_probs":
            logprobs = memoryview(resp.raw_output_contents[i]).cast("f").tolist()
        elif name == "top_log_probs":
            top_lp = (memoryview(resp.raw_output_contents[i]).cast("f").tolist(), out.shape[-1])
        elif name == "top_log_prob_ids":
            top_ids = memoryview(resp.raw_output_contents[i]).cast("i").tolist()
        elif name == "num_input_tokens":
            raw = resp.raw_output_contents[i]
            n_in = int.from_bytes(raw[:4], "little", signed=True) if len(raw) >= 4 else None
    final = resp.parameters["triton_final_response"].bool_param
    if logprobs is not None and len(logprobs) > len(ids):
        logprobs = logprobs[-len(ids) :] if ids else []  # cumulative on some engines: the new tokens' tail
    top = None
    if top_lp is not None and top_ids is not None and top_lp[1]:
        values, k = top_lp
        top = [
            list(zip(top_ids[j : j + k], values[j : j + k], strict=True)) for j in range(0, len(values), k)
        ]
    return Delta(ids, final, logprobs, n_in, top)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
