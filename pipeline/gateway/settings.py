"""What one gateway process runs with: one model, the single source for every place a gateway starts.

`GatewaySettings` IS lpx.yaml's `serving.openai` section (pipeline/config/serving.py's `OpenAIGateway`, every
field inherited with its bounds), plus what is resolved when a gateway starts: where Triton and the tokenizer
are, the served model's name, the keys file and access log as paths, and the engine's limits. So a field added
to `serving.openai` reaches `lpx serve`'s gateway, `lpx gateway -c lpx.yaml` and the Kubernetes sidecar
(`lpx deploy` mounts the config and runs `lpx gateway -c`) with no second list to keep in step.
`lpx serve` writes it as JSON and starts `python -m pipeline.gateway SETTINGS.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..artifacts import home
from ..config import Config, OpenAIGateway
from . import api_keys


class GatewaySettings(OpenAIGateway):
    # resolved at start (the section leaves these to defaults: serving.host, model.name, LPX_HOME)
    host: str = "127.0.0.1"
    model_name: str
    api_keys_file: Path
    access_log: str | None = None  # a file, "-" for stdout, None for none
    # where the served model is
    triton_url: str  # Triton's gRPC host:port
    tokenizer: Path  # the served model's tokenizer folder (<repo>/preprocessing/1/tokenizer)
    # (the engine's limits are not settings: the gateway reads them from the served repository's model
    # parameters, which serving.max_tokens_cap and the build's lengths shape - the ones the engine enforces)


def from_config(
    cfg: Config, triton_url: str, tokenizer: Path, port: int | None = None, **resolved: Any
) -> GatewaySettings:
    """The settings of a gateway in front of `triton_url`: every field of cfg's serving.openai, its
    defaults resolved (host: serving.host; model name: model.name; keys: $LPX_HOME/gateway/keys.json; access
    log: $LPX_HOME/logs/gateway-access.log), then `port` and `resolved` (a caller's own values, such as the
    sidecar's bind address) on top."""
    g = cfg.serving.openai
    data = g.model_dump()
    data.update(
        host=g.host or cfg.serving.host,
        model_name=g.model_name or cfg.model.name,
        api_keys_file=g.api_keys_file or api_keys.default_path(),
        access_log=str(g.access_log or home() / "logs" / "gateway-access.log"),
        triton_url=triton_url,
        tokenizer=Path(tokenizer),
    )
    if port is not None:
        data["port"] = port
    data.update({k: v for k, v in resolved.items() if v is not None})
    return GatewaySettings(**data)
