"""The ModelConfig of each model in LPX's repository (the engine target's `tensorrt_llm` is engine_repo.py's):
LPX's python models, the ensemble's steps, and every model's parameters.

Tensor names, types and dims follow upstream's TensorRT-LLM backend (tests/contracts/tensorrtllm_backend_models.json),
for the request tensors LPX supports, so clients written for upstream work unchanged. Paths in model
parameters are relative to the model's folder: the repository can be moved or mounted anywhere
(except the engine target's gpt_model_path, which is absolute: see engine_repo.py).
"""

from __future__ import annotations

from pathlib import Path

from ...config import Config
from ...facts import trtllm
from ...runtime.tensors import (
    ENGINE_INPUT_NAMES,
    ENSEMBLE_IO,
    PRE_TO_ENGINE,
    PREPROCESSING_INPUT_NAMES,
    TRTLLM_IO,
    VALIDATED_INPUTS,
    preprocessing_specs,
    request_specs,
    specs,
)
from ..build.llmapi import CHECKPOINT_DIR as LLMAPI_CHECKPOINT
from ..build.vllm_target import CHECKPOINT_DIR as VLLM_CHECKPOINT
from . import engine_repo
from .pbtxt import declare
from .proto import mc

MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")
# model -> its code in model_repo/; tensorrt_llm's depends on the target (the engine target's is C++, no code)
SOURCES = {
    "preprocessing": "preprocessing",
    "postprocessing": "postprocessing",
    "tensorrt_llm_bls": "tensorrt_llm_bls",
}
ENGINE_SOURCES = {"torch": "torch_engine", "llmapi": "llmapi", "vllm": "vllm"}
DECOUPLED = {
    "tensorrt_llm",
    "tensorrt_llm_bls",
}  # stream one response per token delta; the ensemble inherits it
# Knobs (module constants for now; to move into lpx.yaml's config later).
APPLY_CHAT_TEMPLATE = (
    False  # preprocessing wraps text_input as one user turn with the tokenizer's chat template
)
BLS_INSTANCE_COUNT = 1  # the BLS model runs each request on its own thread: one instance serves many


def steps(version: str) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """The ensemble's steps at one contract version: (model, {model input: ensemble tensor},
    {model output: ensemble tensor}), wired as upstream's ensemble is, every request input passed on.
    Preprocessing also reads the scalar sampling inputs, to validate them before the engine runs."""
    ensemble_in = {row[0] for row in ENSEMBLE_IO[version]["in"]}
    ensemble_out = {row[0] for row in ENSEMBLE_IO[version]["out"]}
    engine_out = [row[0] for row in TRTLLM_IO[version]["out"]]
    pre_in = {model_in: name for name, model_in in PREPROCESSING_INPUT_NAMES.items() if name in ensemble_in}
    pre_in.update({row[0]: row[0] for row in VALIDATED_INPUTS[version]})
    engine_in = {internal[1]: internal[0] for internal in PRE_TO_ENGINE.values()}
    engine_in.update(
        {model_in: name for name, model_in in ENGINE_INPUT_NAMES[version].items() if name in ensemble_in}
    )
    engine_outputs = {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}
    engine_outputs.update({name: name for name in engine_out if name in ensemble_out})
    return [
        ("preprocessing", pre_in, {out: internal for out, (internal, _) in PRE_TO_ENGINE.items()}),
        ("tensorrt_llm", engine_in, engine_outputs),
        (
            "postprocessing",
            {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
            {"OUTPUT": "text_output"},
        ),
    ]


def request_version(cfg: Config) -> str:
    """The contract version whose request language the ensemble and BLS speak: the engine target's
    TensorRT-LLM line; LPX's own python engines speak the latest."""
    return trtllm.contract_version(cfg.build.trtllm_version) if cfg.build.target == "engine" else "latest"


def parameters(model: str, cfg: Config, max_input_len: int | None = None) -> dict[str, str]:
    """Model parameters; paths are relative to the model's folder. max_input_len: the engine's
    (default: build.max_input_len); preprocessing refuses longer prompts and max_tokens outside
    1..max_tokens_cap with a clear error rather than truncating."""
    if model == "preprocessing":
        return {
            "tokenizer_dir": "1/tokenizer",
            "add_special_tokens": "true",
            "apply_chat_template": str(APPLY_CHAT_TEMPLATE).lower(),
            "max_input_len": str(max_input_len or cfg.build.max_input_len),
            "max_tokens_cap": str(cfg.serving.max_tokens_cap),
            "contract_version": request_version(cfg),
            "max_seq_len": str(cfg.build.max_seq_len),
            # LPX builds engines with max_beam_width 1; LPX's python engines refuse beam search themselves
            "max_beam_width": "1" if cfg.build.target == "engine" else "0",
        }
    if model == "tensorrt_llm_bls":
        counts = engine_repo.counts_tokens(cfg) if cfg.build.target == "engine" else True
        return {
            "tensorrt_llm_model_name": "tensorrt_llm",
            "accumulate_tokens": "false",
            "contract_version": request_version(cfg),
            "engine_counts_tokens": str(counts).lower(),
        }
    if model == "postprocessing":
        return {"tokenizer_dir": "1/tokenizer", "skip_special_tokens": "true"}
    if model == "tensorrt_llm" and cfg.build.target == "llmapi":
        return {
            "llmapi_dir": "1/engine",
            "tokenizer_dir": f"1/engine/{LLMAPI_CHECKPOINT}",
            "exclude_input_in_output": "true",
            "max_tokens_cap": str(cfg.serving.max_tokens_cap),
        }
    if model == "tensorrt_llm" and cfg.build.target == "vllm":
        return {
            "vllm_dir": "1/engine",
            "tokenizer_dir": f"1/engine/{VLLM_CHECKPOINT}",
            "exclude_input_in_output": "true",
            "max_tokens_cap": str(cfg.serving.max_tokens_cap),
        }
    if model == "tensorrt_llm":
        return {
            "gpt_model_path": "1/engine",
            "gpt_model_type": "inflight_fused_batching",
            "tokenizer_dir": "1/engine",
            "exclude_input_in_output": "true",
            "max_tokens_cap": str(cfg.serving.max_tokens_cap),
            "batch_invariant": str(cfg.serving.batch_invariant).lower(),
        }
    return {}


def model_config(
    model: str,
    cfg: Config,
    engine_path: Path | None = None,
    max_input_len: int | None = None,
    tokenizer_info: Path | None = None,
) -> mc.ModelConfig:
    """The `ModelConfig` message of one of MODELS (engine_path: the engine target's copy of the engine;
    tokenizer_info: its xgrammar tokenizer info, None to leave guided decoding off)."""
    engine = cfg.build.target == "engine"
    if engine and model == "tensorrt_llm":
        path = engine_path if engine_path is not None else Path("1/engine")
        return engine_repo.model_config(cfg, path, tokenizer_info)
    version = request_version(cfg)
    if model in ("ensemble", "tensorrt_llm_bls"):
        ins, outs = request_specs(model, version, "in"), request_specs(model, version, "out")
        if model == "tensorrt_llm_bls" and "num_output_tokens" not in {s.name for s in outs}:
            # LPX's BLS counts the tokens of every response itself, also over engines that do not (v0.16)
            outs.append(
                next(s for s in request_specs(model, "latest", "out") if s.name == "num_output_tokens")
            )
    elif model == "preprocessing":
        ins, outs = preprocessing_specs(version, "in"), preprocessing_specs(version, "out")
    else:
        ins, outs = specs(model, "in"), specs(model, "out")
    conf = declare(mc.ModelConfig(name=model, max_batch_size=cfg.build.max_batch_size), ins, outs)
    if model == "ensemble":
        conf.platform = "ensemble"
        for name, inputs, outputs in steps(version):
            step = conf.ensemble_scheduling.step.add(model_name=name, model_version=-1)
            step.input_map.update(inputs)
            step.output_map.update(outputs)
        return conf
    conf.backend = "python"
    conf.model_transaction_policy.decoupled = model in DECOUPLED
    if model != "tensorrt_llm_bls":  # as upstream: the BLS model has no dynamic batching
        conf.dynamic_batching.SetInParent()
    conf.instance_group.add(
        kind=mc.ModelInstanceGroup.KIND_CPU, count=BLS_INSTANCE_COUNT if model == "tensorrt_llm_bls" else 1
    )
    for key, value in parameters(model, cfg, max_input_len).items():
        conf.parameters[key].string_value = value
    return conf
