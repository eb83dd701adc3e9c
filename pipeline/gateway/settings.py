"""What one gateway process runs with: lpx.yaml's `serving.openai` plus where Triton and the tokenizer
are. `lpx serve` writes it as JSON and starts `python -m pipeline.gateway SETTINGS.json`."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..artifacts import home
from ..config import Config
from . import keys


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    triton_url: str  # Triton's gRPC host:port
    tokenizer: Path  # the served model's tokenizer folder (<repo>/preprocessing/1/tokenizer)
    model_name: str
    host: str = "127.0.0.1"
    port: int = 9000
    keys_file: Path
    open_routes: list[str] = ["/health/live", "/health/ready", "/metrics"]
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    rate_limit_storage: str = "memory://"
    max_body_bytes: int = 1_048_576
    # the transport's limits (transport.py), enforced before a request reaches the application:
    # 16 KiB of request line + headers, as Node.js and h11 allow by default (nginx 32 KiB in 8 KiB lines);
    # OpenAI's SDKs send about 1 KiB
    max_header_bytes: int = Field(16_384, ge=1024, le=1_048_576)
    header_timeout_s: float = Field(10.0, gt=0)  # the whole head, from the connection's first byte
    body_timeout_s: float = Field(30.0, gt=0)  # between two reads of a body
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 30.0
    access_log: str | None = None  # a file, "-" for stdout, None for none
    log_prompts: bool = False
    chat_template: Path | None = None
    # the engine's limits; 0: read from the served repository's model parameters
    max_input_len: int = 0
    max_seq_len: int = 0
    max_tokens_cap: int = 0


def from_config(cfg: Config, triton_url: str, tokenizer: Path, port: int | None = None) -> GatewaySettings:
    g = cfg.serving.openai
    return GatewaySettings(
        triton_url=triton_url,
        tokenizer=Path(tokenizer),
        model_name=g.model_name or cfg.model.name,
        host=g.host or cfg.serving.host,
        port=g.port if port is None else port,
        keys_file=g.api_keys_file or keys.default_path(),
        open_routes=list(g.open_routes),
        requests_per_minute=g.requests_per_minute,
        tokens_per_minute=g.tokens_per_minute,
        rate_limit_storage=g.rate_limit_storage,
        max_body_bytes=g.max_body_bytes,
        max_header_bytes=g.max_header_bytes,
        header_timeout_s=g.header_timeout_s,
        body_timeout_s=g.body_timeout_s,
        request_timeout_s=g.request_timeout_s,
        drain_timeout_s=g.drain_timeout_s,
        access_log=str(g.access_log or home() / "logs" / "gateway-access.log"),
        log_prompts=g.log_prompts,
        chat_template=g.chat_template,
        max_tokens_cap=cfg.serving.max_tokens_cap,
    )
