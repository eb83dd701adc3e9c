"""Stage 3: write the Triton model repository of one engine.

Layout (every config.pbtxt is a `ModelConfig` protobuf message printed with text_format, so no
placeholder can be left unfilled):

    preprocessing/   config.pbtxt, 1/model.py, 1/tokenizer/...
    tensorrt_llm/    config.pbtxt, 1/model.py (LPX's torch engine), 1/engine/... (hard links)
                     - engine target: backend `tensorrtllm` (no model.py), see engine_repo.py
                     - llmapi target: 1/model.py is model_repo/llmapi (tensorrt_llm.LLM), 1/engine the
                       llmapi build folder
    postprocessing/  config.pbtxt, 1/model.py, 1/tokenizer/...
    ensemble/        config.pbtxt, 1/
    tensorrt_llm_bls/ config.pbtxt, 1/model.py - LPX's BLS model: the ensemble's request tensors, calling
                     preprocessing, tensorrt_llm (streamed) and postprocessing itself

Tensor names, types and dims follow upstream's TensorRT-LLM backend (tests/contracts/tensorrtllm_backend_models.json), for the
request tensors LPX supports, so clients written for upstream work unchanged. Paths in model
parameters are relative to the model's folder: the repository can be moved or mounted anywhere
(except the engine target's gpt_model_path, which is absolute: see engine_repo.py).
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ...artifacts import link_tree
from ...config import Config
from ...errors import PipelineError
from ...inspection.checkpoint import TOKENIZER_FILES
from ...runtime.engines.llmapi_engine import read_build
from ...runtime.engines.torch_engine import read_meta
from ...runtime.tensors import TENSORS, TOKEN_COUNT_TENSORS, Spec, specs  # noqa: F401 - re-exported for tests
from ..build.llmapi import CHECKPOINT_DIR as LLMAPI_CHECKPOINT
from . import engine_repo

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
HEADER = (
    "# Written by LPX (pipeline/stages/repository.py): change lpx.yaml and rerun 'lpx repo', not this file.\n"
)


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
            engine_repo.STEP_RENAMES[engine_repo.contract_version(cfg)]
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
    renames = engine_repo.STEP_RENAMES[engine_repo.contract_version(cfg)] if engine else {}
    # a v0.16 engine has no num_output_tokens: the ensemble over it cannot offer it (the BLS model counts itself)
    drop = (
        TOKEN_COUNT_TENSORS
        if engine and model == "ensemble" and not engine_repo.counts_tokens(cfg)
        else set()
    )
    conf = mc.ModelConfig(name=model, max_batch_size=cfg.build.max_batch_size)
    for spec in (s for s in specs(model, "in") if s.name not in drop):
        tensor = conf.input.add(
            name=spec.name,
            data_type=mc.DataType.Value(spec.dtype),
            dims=spec.dims,
            optional=spec.optional,
            allow_ragged_batch=spec.ragged,
        )
        if spec.reshape is not None:
            tensor.reshape.SetInParent()
            tensor.reshape.shape.extend(spec.reshape)
    for spec in (s for s in specs(model, "out") if s.name not in drop):
        conf.output.add(name=spec.name, data_type=mc.DataType.Value(spec.dtype), dims=spec.dims)
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


def check_llmapi(options: dict, cfg: Config) -> None:
    """Cross-checks of the Triton config against the llmapi build's LLM-API options."""
    built = options.get("max_batch_size")
    if built is not None and cfg.build.max_batch_size > int(built):
        raise PipelineError(
            f"Triton max_batch_size {cfg.build.max_batch_size} (build.max_batch_size) exceeds the "
            f"llmapi build's max_batch_size {built} - lower build.max_batch_size to {built} or "
            "rebuild with 'lpx build'"
        )
    seq, inp = options.get("max_seq_len"), options.get("max_input_len")
    if seq is not None and inp is not None and int(inp) >= int(seq):
        raise PipelineError(
            f"The llmapi build's max_input_len {inp} leaves no room for output in max_seq_len {seq} "
            "- rebuild with build.max_input_len below build.max_seq_len"
        )


def copy_tokenizer(engine_dir: Path, dest: Path, hint: str | None = None) -> int:
    names = [
        n for n in (*TOKENIZER_FILES, "config.json", "generation_config.json") if (engine_dir / n).is_file()
    ]
    if not {"tokenizer.json", "tokenizer.model", "vocab.json"} & set(names):
        raise PipelineError(
            hint
            or f"No tokenizer files in the engine folder {engine_dir} - rebuild it with "
            "'lpx build' (set model.tokenizer if the checkpoint has none)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(engine_dir / name, dest / name)
    return len(names)


def source_models() -> Path:
    return Path(str(resources.files("model_repo")))


def write_repository(dest: Path, engine_dir: Path, cfg: Config, tokenizer_dir: Path | None = None) -> dict:
    """Write the five models into `dest` (replacing any earlier copy of them); returns a summary.

    tokenizer_dir: where the tokenizer files are (default: engine_dir, which holds them for the torch
    target; a trtllm-build engine folder has none - pass the quantize artifact's state/ folder)."""
    dest, engine_dir = Path(dest), Path(engine_dir)
    target = cfg.build.target
    if target == "torch":
        meta = read_meta(engine_dir)
        fmt, max_input_len = meta["format"], int(meta["max_input_len"])
    elif target == "engine":
        engine = engine_repo.read_engine_config(engine_dir)
        engine_repo.check_engine(engine, cfg)
        fmt = (engine.get("pretrained_config") or {}).get("quantization", {}).get("quant_algo")
        max_input_len = (engine.get("build_config") or {}).get("max_input_len") or cfg.build.max_input_len
        if tokenizer_dir is None:
            raise PipelineError(
                f"The engine folder {engine_dir} has no tokenizer - pass the tokenizer folder "
                "(the quantize artifact's state/ folder)"
            )
    elif target == "llmapi":
        meta, options = read_build(engine_dir)
        check_llmapi(options, cfg)
        fmt, max_input_len = meta.get("format"), options.get("max_input_len") or cfg.build.max_input_len
        tokenizer_dir = tokenizer_dir if tokenizer_dir is not None else engine_dir / str(meta["model"])
    else:
        raise PipelineError(
            f"build.target '{target}' has no Triton repository - set build.target: torch, engine or llmapi"
        )
    tok_src = Path(tokenizer_dir) if tokenizer_dir is not None else engine_dir
    tok_hint = (
        None
        if tokenizer_dir is None
        else f"No tokenizer files in {tok_src} - pass the folder that holds them"
    )
    src = source_models()
    files = 0
    for model in MODELS:
        folder = dest / model
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "1").mkdir(parents=True)
        conf = model_config(model, cfg, (folder / "1" / "engine").resolve(), max_input_len)
        (folder / "config.pbtxt").write_text(HEADER + text_format.MessageToString(conf), encoding="utf-8")
        files += 1
        source = ENGINE_SOURCES.get(target) if model == "tensorrt_llm" else SOURCES.get(model)
        if source is not None:
            code = src / source / "model.py"
            if not code.is_file():
                raise PipelineError(f"LPX's Triton model {code} is missing - reinstall LPX")
            shutil.copy2(code, folder / "1" / "model.py")
            files += 1
        if model in ("preprocessing", "postprocessing"):
            files += copy_tokenizer(tok_src, folder / "1" / "tokenizer", tok_hint)
        if model == "tensorrt_llm":
            files += link_tree(engine_dir, folder / "1" / "engine")[0]
    summary = {
        "models": list(MODELS),
        "files": files,
        "format": fmt,
        "max_batch_size": cfg.build.max_batch_size,
        "decoupled": sorted(DECOUPLED),
    }
    if target == "engine":
        summary["backend"] = "tensorrtllm"
        summary["contract_version"] = engine_repo.contract_version(cfg)
    return summary
