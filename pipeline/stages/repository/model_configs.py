"""The ModelConfig of each model in LPX's repository (the engine target's `tensorrt_llm` is engine_repo.py's):
LPX's python models, the ensemble's steps, and every model's parameters.

Tensor names, types and dims follow upstream's TensorRT-LLM backend (tests/contracts/tensorrtllm_backend_models.json),
for the request tensors LPX supports, so clients written for upstream work unchanged. Paths in model
parameters are relative to the model's folder: the repository can be moved or mounted anywhere
(except the engine target's gpt_model_path, which is absolute: see engine_repo.py).
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ...config import Config
from ...facts import trtllm
from ...runtime.tensors import TOKEN_COUNT_TENSORS, specs
from ..build.llmapi import CHECKPOINT_DIR as LLMAPI_CHECKPOINT
from . import engine_repo
from .pbtxt import declare

MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")
# model -> its code in model_repo/; tensorrt_llm's depends on the target (the engine target's is C++, no code)
SOURCES = {
    "preprocessing": "preprocessing",
    "postprocessing": "postprocessing",
    "tensorrt_llm_bls": "tensorrt_llm_bls",
}
ENGINE_SOURCES = {"torch": "torch_engine", "llmapi": "llmapi"}
DECOUPLED = {
    "tensorrt_llm",
    "tensorrt_llm_bls",
}  # stream one response per token delta; the ensemble inherits it
# Knobs (module constants for now; to move into lpx.yaml's config later).
APPLY_CHAT_TEMPLATE = (
    False  # preprocessing wraps text_input as one user turn with the tokenizer's chat template
)
BLS_INSTANCE_COUNT = 1  # the BLS model runs each request on its own thread: one instance serves many


# The ensemble's steps: (model, {model input: ensemble tensor}, {model output: ensemble tensor}),
# with upstream's internal tensor names.
STEPS: list[tuple[str, dict[str, str], dict[str, str]]] = [
    (
        "preprocessing",
        {
            "QUERY": "text_input",
            "REQUEST_OUTPUT_LEN": "max_tokens",
            "BAD_WORDS_DICT": "bad_words",
            "STOP_WORDS_DICT": "stop_words",
            "END_ID": "end_id",
            "PAD_ID": "pad_id",
        },
        {
            "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
            "INPUT_ID": "_INPUT_ID",
            "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
            "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
            "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
            "OUT_END_ID": "_PREPROCESSOR_END_ID",
            "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
        },
    ),
    (
        "tensorrt_llm",
        {
            "input_ids": "_INPUT_ID",
            "input_lengths": "_REQUEST_INPUT_LEN",
            "request_output_len": "_REQUEST_OUTPUT_LEN",
            "end_id": "_PREPROCESSOR_END_ID",
            "pad_id": "_PREPROCESSOR_PAD_ID",
            "stop_words_list": "_STOP_WORDS_IDS",
            "bad_words_list": "_BAD_WORDS_IDS",
            "runtime_top_k": "top_k",
            "runtime_top_p": "top_p",
            "temperature": "temperature",
            "seed": "seed",
            "streaming": "stream",
            "exclude_input_in_output": "exclude_input_in_output",
            "return_num_output_tokens": "return_num_output_tokens",
        },
        {
            "output_ids": "_TOKENS_BATCH",
            "sequence_length": "_SEQUENCE_LENGTH",
            "num_output_tokens": "num_output_tokens",
        },
    ),
    (
        "postprocessing",
        {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
        {"OUTPUT": "text_output"},
    ),
]


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
        }
    if model == "tensorrt_llm_bls":
        renames = (
            engine_repo.STEP_RENAMES[trtllm.contract_version(cfg.build.trtllm_version)]
            if cfg.build.target == "engine"
            else {}
        )
        counts = engine_repo.counts_tokens(cfg) if cfg.build.target == "engine" else True
        return {
            "tensorrt_llm_model_name": "tensorrt_llm",
            "accumulate_tokens": "false",
            "seed_input_name": renames.get("seed", "seed"),
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
    model: str, cfg: Config, engine_path: Path | None = None, max_input_len: int | None = None
) -> mc.ModelConfig:
    """The `ModelConfig` message of one of MODELS (engine_path: the engine target's copy of the engine)."""
    engine = cfg.build.target == "engine"
    if engine and model == "tensorrt_llm":
        return engine_repo.model_config(cfg, engine_path if engine_path is not None else Path("1/engine"))
    renames = engine_repo.STEP_RENAMES[trtllm.contract_version(cfg.build.trtllm_version)] if engine else {}
    # a v0.16 engine has no num_output_tokens: the ensemble over it cannot offer it (the BLS model counts itself)
    drop = (
        TOKEN_COUNT_TENSORS
        if engine and model == "ensemble" and not engine_repo.counts_tokens(cfg)
        else set()
    )
    conf = declare(
        mc.ModelConfig(name=model, max_batch_size=cfg.build.max_batch_size),
        (s for s in specs(model, "in") if s.name not in drop),
        (s for s in specs(model, "out") if s.name not in drop),
    )
    if model == "ensemble":
        conf.platform = "ensemble"
        for name, inputs, outputs in STEPS:
            step = conf.ensemble_scheduling.step.add(model_name=name, model_version=-1)
            step.input_map.update(
                {renames.get(k, k): v for k, v in inputs.items() if k not in drop}
                if name == "tensorrt_llm"
                else inputs
            )
            step.output_map.update({k: v for k, v in outputs.items() if k not in drop})
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
