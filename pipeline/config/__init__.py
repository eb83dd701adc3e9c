"""The typed `lpx.yaml` schema and its loading. Unknown keys are errors; every error names its path.
`resolve_config` is the one rule for which file a command uses.

  __init__.py  the sections the stages read (model .. serving), Config, loading and error messages
  base.py      Strict: the base of every section (unknown keys are errors)
  deploy.py    `deploy`: what `lpx deploy` writes
  tune.py      `tune`: the search `lpx tune` runs
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError, UsageError
from ..facts import formats, trtllm
from .base import Strict
from .deploy import Deploy
from .tune import Tune

FORMATS = tuple(formats.FORMATS)
KV_CACHE = tuple(formats.KV_CACHE_TYPES)
EXPORTS = ("trtllm", "hf", "state")
TARGETS = ("engine", "llmapi", "torch")
TRTLLM_VERSIONS = trtllm.BUILD_LINES
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ARCH_RE = r"^sm[0-9]{2,3}[a-z]?$"


class ModelSection(Strict):
    name: str = Field(pattern=NAME_RE, description="Short name; used in artifact paths.")
    checkpoint: Path = Field(
        description="Local Hugging Face checkpoint folder (config.json + *.safetensors)."
    )
    tokenizer: Path | None = Field(None, description="Tokenizer folder, if not inside the checkpoint.")
    allow_pickle: bool = Field(
        False, description="Allow loading pickle-only weights (*.bin). Off: they can run code."
    )
    trust_remote_code: bool = Field(False, description="Allow the checkpoint's own Python code to run.")


class Quantization(Strict):
    format: Literal[FORMATS] = "none"  # type: ignore[valid-type]
    kv_cache: Literal[KV_CACHE] = "none"  # type: ignore[valid-type]
    exclude: list[str] = Field(
        default_factory=list, description="Glob patterns of modules kept in high precision."
    )
    awq_block_size: int = Field(128, ge=16, description="Group size for int4_awq / w4a8_awq.")
    exports: list[Literal[EXPORTS]] = Field(  # type: ignore[valid-type]
        default_factory=list,
        description="Exports to write beyond the one build.target needs (engine: trtllm, llmapi: hf, torch: state).",
    )

    @field_validator("exports")
    @classmethod
    def _exports(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("lists an export twice")
        return v


class Variant(Strict):
    name: str = Field(pattern=NAME_RE)
    quantization: Quantization = Field(default_factory=Quantization)


class TextSamples(Strict):
    """Where a stage's text samples come from (pipeline/texts.py)."""

    data: Path | None = Field(
        None,
        description="A .txt (one sample per paragraph) or .jsonl file; LPX's own text "
        "(calibration or held-out) if unset.",
    )
    jsonl_field: str = "text"
    samples: int = Field(32, ge=1)
    seq_len: int = Field(256, ge=8)


class Calibration(TextSamples):
    batch_size: int = Field(1, ge=1)


class Evaluation(TextSamples):
    samples: int = Field(10, ge=1)


class QualityGate(Strict):
    """Limits a quantized variant must meet against the unquantized model before it is built."""

    max_kl: float | None = Field(
        None, ge=0, description="Largest mean KL divergence of next-token distributions."
    )
    min_top1_agreement: float | None = Field(
        None, ge=0, le=1, description="Smallest share of equal argmax tokens."
    )
    max_ppl_increase_pct: float | None = Field(
        None, ge=0, description="Largest perplexity increase, percent."
    )


class Build(Strict):
    target: Literal[TARGETS] = "torch"  # type: ignore[valid-type]
    trtllm_version: Literal[TRTLLM_VERSIONS] = Field(  # type: ignore[valid-type]
        trtllm.BUILD_LINES[0],
        description=f"TensorRT-LLM line the engine/checkpoint must load in: {' or '.join(trtllm.BUILD_LINES)}.",
    )
    archs: list[str] = Field(default_factory=lambda: ["sm90"], min_length=1)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_batch_size: int = Field(8, ge=1)
    max_input_len: int = Field(1024, ge=1)
    max_seq_len: int = Field(2048, ge=2)
    max_num_tokens: int = Field(8192, ge=1)
    tp_size: int = Field(1, ge=1)
    pp_size: int = Field(1, ge=1)
    timeout_s: float = Field(3600, gt=0, description="trtllm-build is killed after this many seconds.")
    gpu: str | None = Field(
        None,
        description="Target GPU model for the memory check (e.g. h100-sxm, l4); "
        "default: the GPU present, when its arch is being built.",
    )

    @field_validator("archs")
    @classmethod
    def _archs(cls, v: list[str]) -> list[str]:
        for a in v:
            if not re.match(ARCH_RE, a):
                raise ValueError(
                    f"'{a}' is not a GPU architecture; use the SM name, e.g. sm80, sm89, sm90, sm100"
                )
        if len(set(v)) != len(v):
            raise ValueError("lists an architecture twice")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> Build:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be below max_seq_len ({self.max_seq_len}) "
                "to leave room for output tokens"
            )
        return self


class OpenAIGateway(Strict):
    """The OpenAI-compatible gateway `lpx serve` starts beside tritonserver (docs/gateway.md)."""

    enabled: bool = Field(True, description="Start the gateway with 'lpx serve'.")
    host: str | None = Field(None, description="Address the gateway binds; default serving.host (127.0.0.1).")
    port: int = Field(9000, ge=0, le=65535, description="0 picks a free port.")
    model_name: str | None = Field(
        None, description="The model id clients send and /v1/models lists; default model.name."
    )
    api_keys_file: Path | None = Field(
        None,
        description="Hashed API keys ('lpx keys add'); default $LPX_HOME/gateway/keys.json. "
        "Once it holds a key, every request needs one.",
    )
    open_routes: list[str] = Field(
        default_factory=lambda: ["/health/live", "/health/ready", "/metrics"],
        description="Routes answered without an API key.",
    )
    requests_per_minute: int | None = Field(None, ge=1, description="Per key, unless the key sets its own.")
    tokens_per_minute: int | None = Field(
        None, ge=1, description="Prompt + completion tokens per key per minute, unless the key sets its own."
    )
    rate_limit_storage: str = Field(
        "memory://",
        description="The `limits` storage: memory:// for one gateway, redis://HOST:PORT shared by several.",
    )
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Larger request bodies get 413.")
    max_header_bytes: int = Field(
        16_384,
        ge=1024,
        le=1_048_576,
        description="Request line + headers above this get 431 (before the key).",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request's headers must arrive within this; else 408 and the connection closed.",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="Longest pause while a body is read; else 408 and the connection closed."
    )
    request_timeout_s: float = Field(600.0, gt=0, description="A request still running then is ended.")
    drain_timeout_s: float = Field(30.0, ge=0, description="On SIGTERM, in-flight streams get this long.")
    access_log: Path | None = Field(
        None, description="One JSON line per request; default $LPX_HOME/logs/gateway-access.log."
    )
    log_prompts: bool = Field(False, description="Put the prompt text in the access log.")
    chat_template: Path | None = Field(
        None, description="A Jinja chat template file, for a tokenizer that has none (or to replace it)."
    )


class Serving(Strict):
    host: str = Field("127.0.0.1", description="Address Triton binds. 0.0.0.0 exposes it to the network.")
    http_port: int = Field(8000, ge=0, le=65535, description="0 picks a free port.")
    grpc_port: int = Field(8001, ge=0, le=65535)
    metrics_port: int = Field(8002, ge=0, le=65535)
    max_tokens_cap: int = Field(1024, ge=1, description="Largest max_tokens a request may ask for.")
    batch_invariant: bool = Field(
        True,
        description="torch target: attention computed per request, so a request's "
        "tokens do not depend on the batch it shares (about 10-30% slower; see the README).",
    )
    ready_timeout_s: float = Field(180.0, gt=0)
    openai: OpenAIGateway = Field(default_factory=OpenAIGateway)


class Config(Strict):
    model: ModelSection
    variants: list[Variant] = Field(min_length=1)
    calibration: Calibration = Field(default_factory=Calibration)
    evaluation: Evaluation = Field(default_factory=Evaluation)
    quality_gate: QualityGate = Field(default_factory=QualityGate)
    build: Build = Field(default_factory=Build)
    serving: Serving = Field(default_factory=Serving)
    deploy: Deploy = Field(default_factory=Deploy)
    tune: Tune = Field(default_factory=Tune)

    @field_validator("variants")
    @classmethod
    def _unique(cls, v: list[Variant]) -> list[Variant]:
        names = [x.name for x in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(dup)}")
        return v

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise UsageError(
            f"No variant '{name}' in the config; known: {', '.join(v.name for v in self.variants)}"
        )

    def select(self, names: tuple[str, ...] | list[str] | None) -> list[Variant]:
        return [self.variant(n) for n in names] if names else list(self.variants)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("literal[", "function-")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _message(err: dict) -> str:
    kind = err["type"]
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return "must be one of " + ", ".join(re.findall(r"'([^']*)'", expected))
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; `lpx config schema` lists every key)"
    if kind == "missing":
        return "required"
    msg = err["msg"]
    return msg[len("Value error, ") :] if msg.startswith("Value error, ") else msg


def format_errors(exc: ValidationError) -> list[str]:
    return [f"{_loc(e['loc'])}: {_message(e)}" for e in exc.errors()]


def _resolve_paths(cfg: Config, base: Path) -> Config:
    def res(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p).resolve()

    cfg.model.checkpoint = res(cfg.model.checkpoint)
    cfg.model.tokenizer = res(cfg.model.tokenizer)
    cfg.calibration.data = res(cfg.calibration.data)
    cfg.evaluation.data = res(cfg.evaluation.data)
    gateway = cfg.serving.openai
    gateway.api_keys_file = res(gateway.api_keys_file)
    gateway.access_log = res(gateway.access_log)
    gateway.chat_template = res(gateway.chat_template)
    return cfg


def parse_config(data: object, source: str = "config", base: Path | None = None) -> Config:
    if not isinstance(data, dict):
        raise ConfigError(["(top level): must be a mapping with keys model, variants, ..."], source)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc), source) from None
    return _resolve_paths(cfg, base or Path.cwd())


def load_config(path: Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"No config file at {path} - create one with 'lpx init DIR' or pass -c FILE")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UsageError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return parse_config(data, str(path), path.resolve().parent)


def resolve_config(path: Path | None, report=None) -> Config:
    """The config a command uses: -c PATH, else $LPX_CONFIG, else ./lpx.yaml, else the built-in demo
    (written under $LPX_HOME/demo on first use). `report` (a progress.Reporter) is told which."""
    say = report.info if report is not None else (lambda _message: None)
    if path is None and os.environ.get("LPX_CONFIG"):
        path = Path(os.environ["LPX_CONFIG"])
    if path is None and Path("lpx.yaml").is_file():
        path = Path("lpx.yaml")
        say("using ./lpx.yaml")
    if path is None:
        from ..demo import ensure_demo

        say("no -c given: running the built-in demo (a tiny Llama, FP8, torch target)")
        path = ensure_demo(report)
    return load_config(path)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def json_schema() -> dict:
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "LPX configuration (lpx.yaml)"
    return schema
