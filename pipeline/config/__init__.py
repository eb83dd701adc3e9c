"""The typed `lpx.yaml` schema and its loading. Unknown keys are errors; every error names its path.
`resolve_config` is the one rule for which file a command uses.

  __init__.py  the sections the stages read (model .. build), Config, loading
  base.py      Strict: the base of every section (strict types, unknown keys are errors) and the limits
  serving.py   `serving`: tritonserver's ports and limits, the OpenAI gateway (ports distinct)
  deploy.py    `deploy`: what `lpx deploy` writes
  quality.py   `calibration`, `evaluation` (text samples) and `quality_gate` (its default limits)
  tune.py      `tune`: the search `lpx tune` runs
  messages.py  one `path: message` line per problem, naming the fix (did-you-mean, limits and why)
  yamlfile.py  reading the file: UTF-8 YAML, a mapping, no key twice; each failure named with its fix
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from ..errors import ConfigError, UsageError
from ..facts import formats, trtllm
from .base import (
    GPUS,
    INT32,
    INT32_MAX,
    MAX_GPUS,
    NAME_RE,
    WEEK,
    ConfigPath,
    Strict,
    bounded,
    name_field,
)
from .deploy import Deploy
from .messages import format_errors as _format_errors
from .messages import section_of
from .quality import GATE_DEFAULTS, Calibration, Evaluation, QualityGate
from .serving import OpenAIGateway, Serving
from .tune import Tune
from .yamlfile import read_config_file

__all__ = [  # the names other packages import from pipeline.config
    "NAME_RE",
    "Calibration",
    "Config",
    "Evaluation",
    "GATE_DEFAULTS",
    "OpenAIGateway",
    "QualityGate",
    "Quantization",
    "Serving",
    "Variant",
    "dump_config",
    "format_errors",
    "json_schema",
    "load_config",
    "parse_config",
    "resolve_config",
]

FORMATS = tuple(formats.FORMATS)
KV_CACHE = tuple(formats.KV_CACHES)
EXPORTS = ("trtllm", "hf", "state")
TARGETS = formats.TARGETS
TRTLLM_VERSIONS = trtllm.BUILD_LINES
ARCH_RE = r"^sm[0-9]{2,3}[a-z]?$"


class ModelSection(Strict):
    name: str = name_field(description="Short name; used in artifact paths and file names.")
    checkpoint: ConfigPath = Field(
        description="Local Hugging Face checkpoint folder (config.json + *.safetensors)."
    )
    tokenizer: ConfigPath | None = Field(None, description="Tokenizer folder, if not inside the checkpoint.")
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
    awq_block_size: int = bounded(
        128, ge=16, le=INT32_MAX, limit=INT32, description="Group size for int4_awq / w4a8_awq."
    )
    exports: list[Literal[EXPORTS]] = Field(  # type: ignore[valid-type]
        default_factory=list,
        description="Exports to write beyond the one build.target needs (engine: trtllm, llmapi: hf, torch: state, vllm: hf).",
    )

    @field_validator("exports")
    @classmethod
    def _exports(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("lists an export twice")
        return v


class VariantBuild(Strict):
    """What a variant overrides of the config's build section (engines compared side by side)."""

    target: Literal[TARGETS] | None = Field(  # type: ignore[valid-type]
        None, description="This variant's build target; default: build.target."
    )


class Variant(Strict):
    name: str = name_field(description="Used in artifact paths and file names.")
    quantization: Quantization = Field(default_factory=Quantization)
    build: VariantBuild = Field(default_factory=VariantBuild)


class Build(Strict):
    target: Literal[TARGETS] = "torch"  # type: ignore[valid-type]
    trtllm_version: Literal[TRTLLM_VERSIONS] | None = Field(  # type: ignore[valid-type]
        None,
        description=f"TensorRT-LLM line the engine/checkpoint must load in: {' or '.join(trtllm.BUILD_LINES)}; "
        f"default: the newest the target builds for (engine {trtllm.ENGINE_LINES[0]}, "
        f"llmapi {trtllm.LLMAPI_LINES[0]}).",
    )
    archs: list[str] = Field(default_factory=lambda: ["sm90"], min_length=1)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_batch_size: int = bounded(8, ge=1, le=INT32_MAX, limit=INT32)
    max_input_len: int = bounded(1024, ge=1, le=INT32_MAX, limit=INT32)
    max_seq_len: int = bounded(2048, ge=2, le=INT32_MAX, limit=INT32)
    max_num_tokens: int = bounded(8192, ge=1, le=INT32_MAX, limit=INT32)
    tp_size: int = bounded(1, ge=1, le=MAX_GPUS, limit=GPUS)
    pp_size: int = bounded(1, ge=1, le=MAX_GPUS, limit=GPUS)
    timeout_s: float = bounded(
        3600, gt=0, le=WEEK, limit="a week", description="trtllm-build is killed after this many seconds."
    )
    eager: bool = Field(
        False,
        description="build.target vllm: run the model without torch.compile (vLLM's enforce_eager): "
        "the server starts in seconds instead of minutes on a CPU, each step runs somewhat slower.",
    )
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
        why = trtllm.target_refusal(self.target, self.trtllm_version) if self.trtllm_version else None
        if why:
            raise ValueError(why)
        if self.trtllm_version is None:
            self.__dict__["trtllm_version"] = trtllm.default_line(self.target)  # not "set": line_for
        return self

    @property
    def ranks(self) -> int:
        """GPUs (= Triton ranks) one engine needs: tp_size x pp_size for the engine target, else 1 (llmapi,
        torch and vllm run one process per model here)."""
        return self.tp_size * self.pp_size if self.target == "engine" else 1


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
    _base_target: str | None = PrivateAttr(None)  # build.target before for_variant applied a variant's own

    @field_validator("variants")
    @classmethod
    def _unique(cls, v: list[Variant]) -> list[Variant]:
        names = [x.name for x in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variant names must be unique; repeated: {', '.join(dup)}")
        return v

    @model_validator(mode="after")
    def _servable(self) -> Config:
        """Each variant's target against the TensorRT-LLM line, and its format against what that target
        (and line) serves: refused here, before any stage runs."""
        for i, v in enumerate(self.variants):
            why = serving_refusal(self.build, v)
            if why:
                raise ValueError(f"variants[{i}] '{v.name}': {why}")
        if self.build.eager and all((v.build.target or self.build.target) != "vllm" for v in self.variants):
            raise ValueError(
                "build.eager is vLLM's enforce_eager and no variant builds for build.target vllm - "
                "remove build.eager, or set build.target: vllm"
            )
        return self

    def for_variant(self, variant: Variant) -> Config:
        """This config as `variant` builds it: the variant's build overrides (target) applied to build,
        and build.trtllm_version, unless the config pins it, the newest line that target builds for."""
        target = variant.build.target
        if target is None or target == self.build.target:
            return self
        build = self.build.model_copy(
            update={"target": target, "trtllm_version": line_for(self.build, target)}
        )
        copy = self.model_copy(update={"build": build})  # a copy, not an assignment: validated already
        copy._base_target = self._base_target or self.build.target
        return copy

    def target_of(self, variant: Variant) -> str:
        """The build target `variant` is built for: its own, else the config's build.target (the one
        before for_variant applied another variant's)."""
        return variant.build.target or self._base_target or self.build.target

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise UsageError(
            f"No variant '{name}' in the config; known: {', '.join(v.name for v in self.variants)}"
        )

    def select(self, names: tuple[str, ...] | list[str] | None) -> list[Variant]:
        return [self.variant(n) for n in names] if names else list(self.variants)


def line_for(build: Build, target: str) -> str:
    """The TensorRT-LLM line `target` builds for: build.trtllm_version where the config sets it, else the
    newest line of that target (engine 1.2, llmapi 1.3)."""
    if build.trtllm_version and "trtllm_version" in build.model_fields_set:
        return build.trtllm_version
    return trtllm.default_line(target)


def serving_refusal(build: Build, variant: Variant) -> str | None:
    """Why `variant` cannot be built with `build` (its target vs the TensorRT-LLM line, its format vs what
    the target serves, its KV-cache type vs its format), naming the fix; None when it can. A format the
    line's checkpoints do not know (nvfp4 on 0.16) is the build stage's check: `lpx matrix` lists such cells
    as excluded."""
    target = variant.build.target or build.target
    q = variant.quantization
    return formats.refusal(q.format, q.kv_cache, target=target, line=line_for(build, target))


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


def format_errors(exc: ValidationError, root: type[BaseModel] | None = None) -> list[str]:
    """One `path: message` line per problem of `exc`; `root` (default: the section of Config that raised)."""
    return _format_errors(exc, root or section_of(exc, Config))


def parse_config(data: object, source: str = "config", base: Path | None = None) -> Config:
    if not isinstance(data, dict):
        raise ConfigError(["(top level): must be a mapping with keys model, variants, ..."], source)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, Config), source) from None
    return _resolve_paths(cfg, base or Path.cwd())


def load_config(path: Path) -> Config:
    """The validated config in the lpx.yaml at `path` (yamlfile.py names what is wrong with the file)."""
    path = Path(path)
    return parse_config(read_config_file(path), str(path), path.resolve().parent)


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


def dump_config(cfg: Config, exclude_defaults: bool = False) -> str:
    """cfg as lpx.yaml text that load_config reads back to the same Config (`exclude_defaults`: only the
    values that differ from LPX's defaults)."""
    data = cfg.model_dump(mode="json", exclude_defaults=exclude_defaults)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def json_schema() -> dict:
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "LPX configuration (lpx.yaml)"
    return schema
