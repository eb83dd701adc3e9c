"""What `lpx bench` measures when no ready URL is given: the running `lpx serve`'s OpenAI gateway
(`--api openai`), or a variant LPX builds through the stages and serves on 127.0.0.1 for the run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .load import ENGINE
from .options import BenchOptions

TRITON_MODELS = ("ensemble", "tensorrt_llm_bls", ENGINE)


def openai_target(opts: BenchOptions) -> BenchOptions:
    """--api openai: the URL (default: the running server's gateway), the key, and the model id (Triton's
    model names mean "the server's first model")."""
    if opts.api != "openai":
        return opts
    url = opts.url
    if url is None:
        from ..served import running_server

        url = running_server().get("openai_url")
        if not url:
            raise UsageError("--api openai measures a running server: pass --url http://HOST:PORT")
    from ..client import api_key as find_key
    from ..client import served_model

    key = find_key(opts.api_key)
    model = served_model(url, key) if opts.model in TRITON_MODELS else opts.model
    return opts.with_(url=url, protocol="openai", api_key=key, model=model)


def as_served(opts: BenchOptions, url: str, served: dict[str, Any]) -> BenchOptions:
    """The options of a run against a variant LPX serves: its URL, label, variant, artifact, repository
    and provenance (the config and the key of every artifact behind it)."""
    return opts.with_(
        url=url,
        config_path=None,
        label=opts.label or served["name"],
        variant_ref=f"{served['model']}/{served['name']}",
        artifact=served["artifact"],
        provenance=served["provenance"],
        repo=served["repo"],
        api="triton",
        endpoint="chat",
        api_key=None,
    )


@contextlib.contextmanager
def served_variant(
    config_path: Path | None, variant_name: str | None, protocol: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Run the stages for one variant, serve its repository on 127.0.0.1, yield (url, variant info), stop."""
    from ..config import resolve_config
    from ..progress import Reporter
    from ..served import served

    report = Reporter()
    cfg = resolve_config(config_path, report)
    variants = cfg.select([variant_name] if variant_name else None)
    if len(variants) != 1:
        raise UsageError(
            "lpx bench -c measures one variant; pick it with --variant "
            f"(have: {', '.join(v.name for v in variants)})"
        )
    with served(cfg, variants[0].name, report, gateway=False) as running:
        server, built = running.triton, running.built
        yield (
            server.grpc_url if protocol == "grpc" else server.http_url,
            {
                "model": cfg.model.name,
                "name": variants[0].name,
                "artifact": built.engine.path,
                "repo": built.repo.path,
                "provenance": {
                    "target": cfg.target_of(
                        variants[0]
                    ),  # the engine that served it: a column of lpx compare
                    "config": cfg.model_dump(mode="json"),
                    "artifact_keys": {k: a.key for k, a in built.outcome.artifacts.items()},
                },
            },
        )
