"""lpx.yaml's `serving` section: tritonserver's ports and limits, and the OpenAI gateway beside it."""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import DAY, HOUR, INT32, INT32_MAX, ConfigPath, Strict, bounded, port

WILDCARDS = ("0.0.0.0", "::", "")


class OpenAIGateway(Strict):
    """The OpenAI-compatible gateway `lpx serve` starts beside tritonserver (docs/gateway.md)."""

    enabled: bool = Field(True, description="Start the gateway with 'lpx serve'.")
    host: str | None = Field(None, description="Address the gateway binds; default serving.host (127.0.0.1).")
    port: int = port(9000, description="0 picks a free port.")
    model_name: str | None = Field(
        None, description="The model id clients send and /v1/models lists; default model.name."
    )
    api_keys_file: ConfigPath | None = Field(
        None,
        description="Hashed API keys ('lpx keys add'); default $LPX_HOME/gateway/keys.json. "
        "Once it holds a key, every request needs one.",
    )
    open_routes: list[str] = Field(
        default_factory=lambda: ["/health/live", "/health/ready", "/metrics"],
        description="Routes answered without an API key.",
    )
    requests_per_minute: int | None = bounded(
        None,
        ge=1,
        le=INT32_MAX,
        limit="the largest 32-bit count",
        description="Per key, unless the key sets its own.",
    )
    tokens_per_minute: int | None = bounded(
        None,
        ge=1,
        le=INT32_MAX,
        limit="the largest 32-bit count",
        description="Prompt + completion tokens per key per minute, unless the key sets its own.",
    )
    rate_limit_storage: str = Field(
        "memory://",
        description="The `limits` storage: memory:// for one gateway, redis://HOST:PORT shared by several.",
    )
    max_body_bytes: int = bounded(
        1_048_576, ge=1024, le=2**30, limit="1 GiB", description="Larger request bodies get 413."
    )
    max_header_bytes: int = bounded(
        16_384,
        ge=1024,
        le=1_048_576,
        limit="1 MiB",
        description="Request line + headers above this get 431 (before the key).",
    )
    header_timeout_s: float = bounded(
        10.0,
        gt=0,
        le=HOUR,
        limit="an hour",
        description="A request's headers must arrive within this; else 408 and the connection closed.",
    )
    body_timeout_s: float = bounded(
        30.0,
        gt=0,
        le=HOUR,
        limit="an hour",
        description="Longest pause while a body is read; else 408 and the connection closed.",
    )
    request_timeout_s: float = bounded(
        600.0, gt=0, le=DAY, limit="a day", description="A request still running then is ended."
    )
    drain_timeout_s: float = bounded(
        30.0, ge=0, le=HOUR, limit="an hour", description="On SIGTERM, in-flight streams get this long."
    )
    access_log: ConfigPath | None = Field(
        None, description="One JSON line per request; default $LPX_HOME/logs/gateway-access.log."
    )
    log_prompts: bool = Field(False, description="Put the prompt text in the access log.")
    chat_template: ConfigPath | None = Field(
        None, description="A Jinja chat template file, for a tokenizer that has none (or to replace it)."
    )


class Serving(Strict):
    host: str = Field("127.0.0.1", description="Address Triton binds. 0.0.0.0 exposes it to the network.")
    http_port: int = port(8000, description="0 picks a free port.")
    grpc_port: int = port(8001)
    metrics_port: int = port(8002)
    max_tokens_cap: int = bounded(
        1024, ge=1, le=INT32_MAX, limit=INT32, description="Largest max_tokens a request may ask for."
    )
    batch_invariant: bool = Field(
        True,
        description="torch target: attention computed per request, so a request's "
        "tokens do not depend on the batch it shares (about 10-30% slower; see the README).",
    )
    ready_timeout_s: float = bounded(180.0, gt=0, le=DAY, limit="a day")
    log_stdout: bool = Field(
        False,
        description="Copy tritonserver's log to stdout too (a container: kubectl logs); the log file is "
        "then capped at 64 MiB. 'lpx serve --log-stdout' sets it.",
    )
    run_question: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="What 'lpx run' asks each variant once it serves: one user message through the OpenAI "
        "gateway's /v1/chat/completions (the tokenizer's chat template); unset: a fixed text completed "
        "over Triton's gRPC.",
    )
    openai: OpenAIGateway = Field(default_factory=OpenAIGateway)

    @model_validator(mode="after")
    def _distinct_ports(self) -> Serving:
        """Two servers cannot listen on one port of one address: refused here rather than by tritonserver
        (exit 1) or the gateway at start. 0 (a free port each) never collides."""
        if self.run_question is not None and not self.openai.enabled:
            raise ValueError(
                "serving.run_question is asked through the OpenAI gateway and serving.openai.enabled is "
                "false - enable the gateway, or remove run_question ('lpx run' then completes a fixed text)"
            )
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        gw = self.openai
        gw_host = self.host if gw.host is None else gw.host
        shared = gw_host == self.host or gw_host in WILDCARDS or self.host in WILDCARDS
        if gw.enabled and shared:
            ports["openai.port"] = gw.port
        seen: dict[int, str] = {}
        for name, number in ports.items():
            if number and number in seen:
                raise ValueError(
                    f"serving.{seen[number]} and serving.{name} are both {number} - give each server its "
                    "own port (0 picks a free one)"
                )
            seen[number] = name
        return self
