"""`lpx bench --api openai`: the same load, timelines and metrics against an OpenAI-compatible server
(LPX's gateway, or any other) instead of Triton.

Each request is a streamed /v1/chat/completions (the prompt as one user message) or /v1/completions with
`stream_options.include_usage`, so the server's usage gives the measured ISL and OSL, and temperature 0
(greedy), as the Triton path's requests decode. With the output length forced (target.py probes the
server first), each request also sends vLLM's ignore_eos and min_tokens = max_tokens, so every answer has
exactly max_tokens tokens. TTFT is the first
chunk that carries text; a chunk counts one token on arrival and the last one absorbs the difference
to usage.completion_tokens (ITL = (E2E - TTFT) / (OSL - 1) needs only the total).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from ..client import base_url
from .senders import http_session, sse_events

ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class OpenAISender:
    """The load generator's sender (load.py's GrpcSender / HttpSender interface) for OpenAI's API."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.chat = spec.endpoint == "chat"
        self.endpoint = base_url(spec.url) + ROUTES[spec.endpoint]
        headers = {"Content-Type": "application/json"}
        if spec.api_key:
            headers["Authorization"] = f"Bearer {spec.api_key}"
        self.session = http_session(spec.timeout_s, headers)

    def request(self, tensors: dict[str, tuple[str, Any]]) -> bytes:
        """The body for the text prompt and max_tokens the load drew (text tensors, as for the ensemble)."""
        text = tensors["text_input"][1].reshape(-1)[0]
        text = text.decode() if isinstance(text, bytes) else str(text)
        n = int(tensors["max_tokens"][1].reshape(-1)[0])
        body: dict[str, Any] = {
            "model": self.spec.model,
            "max_tokens": n,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,  # greedy, as the Triton path's requests (no sampling inputs: greedy there)
        }
        if "min_tokens" in tensors:  # spec.force_output: exactly n tokens
            body["ignore_eos"], body["min_tokens"] = True, n
        if self.chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return json.dumps(body).encode()

    async def send(self, body: bytes, rec: Any) -> None:
        rec.sent, rec.sent_ns = time.perf_counter(), time.time_ns()
        completion = None
        async with contextlib.aclosing(sse_events(self.session, self.endpoint, data=body)) as events:
            async for t, event in events:
                if "error" in event:
                    raise RuntimeError(str(event["error"].get("message", event["error"])))
                usage = event.get("usage")
                if usage:
                    rec.input_tokens, rec.input_counted_by = int(usage["prompt_tokens"]), "usage"
                    completion = int(usage["completion_tokens"])
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
                    if text:
                        rec.times.append(t)
                        rec.tokens.append(1)
        if completion is not None and rec.tokens:
            rec.tokens[-1] += completion - sum(rec.tokens)  # the server's count; may be < 0 on the last
        elif completion:  # tokens without text (end-of-sequence only): counted, no text timeline
            rec.tokens, rec.times = [completion], [time.perf_counter()]

    async def close(self) -> None:
        await self.session.close()
