"""Stage 3: write the Triton model repository of one engine.

Layout (every config.pbtxt is a `ModelConfig` protobuf message printed with text_format, so no
placeholder can be left unfilled):

    preprocessing/   config.pbtxt, 1/model.py, 1/tokenizer/...
    tensorrt_llm/    config.pbtxt, 1/model.py (LPX's torch engine), 1/engine/... (hard links)
    postprocessing/  config.pbtxt, 1/model.py, 1/tokenizer/...
    ensemble/        config.pbtxt, 1/

Tensor names, types and dims follow upstream's TensorRT-LLM backend (shared/contracts), for the
request tensors LPX supports, so clients written for upstream work unchanged. Paths in model
parameters are relative to the model's folder: the repository can be moved or mounted anywhere.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..artifacts import link_tree
from ..checkpoint import TOKENIZER_FILES
from ..config import Config
from ..engines.torch_engine import read_meta
from ..errors import PipelineError
from ..tensors import TENSORS, Spec, specs  # noqa: F401 - re-exported for tests

MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble")
SOURCES = {"preprocessing": "preprocessing", "tensorrt_llm": "torch_engine", "postprocessing": "postprocessing"}
DECOUPLED = {"tensorrt_llm"}  # streams one response per token delta; the ensemble inherits it
HEADER = "# Written by LPX (pipeline/stages/repository.py): change lpx.yaml and rerun 'lpx repo', not this file.\n"



# The ensemble's steps: (model, {model input: ensemble tensor}, {model output: ensemble tensor}),
# with upstream's internal tensor names.
STEPS: list[tuple[str, dict[str, str], dict[str, str]]] = [
    ("preprocessing",
     {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "BAD_WORDS_DICT": "bad_words",
      "STOP_WORDS_DICT": "stop_words", "END_ID": "end_id", "PAD_ID": "pad_id"},
     {"REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN", "INPUT_ID": "_INPUT_ID", "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
      "STOP_WORDS_IDS": "_STOP_WORDS_IDS", "BAD_WORDS_IDS": "_BAD_WORDS_IDS", "OUT_END_ID": "_PREPROCESSOR_END_ID",
      "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID"}),
    ("tensorrt_llm",
     {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN", "request_output_len": "_REQUEST_OUTPUT_LEN",
      "end_id": "_PREPROCESSOR_END_ID", "pad_id": "_PREPROCESSOR_PAD_ID", "stop_words_list": "_STOP_WORDS_IDS",
      "bad_words_list": "_BAD_WORDS_IDS", "runtime_top_k": "top_k", "runtime_top_p": "top_p",
      "temperature": "temperature", "seed": "seed", "streaming": "stream",
      "exclude_input_in_output": "exclude_input_in_output"},
     {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}),
    ("postprocessing",
     {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
     {"OUTPUT": "text_output"}),
]


def parameters(model: str, cfg: Config) -> dict[str, str]:
    """Model parameters; paths are relative to the model's folder."""
    if model == "preprocessing":
        return {"tokenizer_dir": "1/tokenizer", "add_special_tokens": "true"}
    if model == "postprocessing":
        return {"tokenizer_dir": "1/tokenizer", "skip_special_tokens": "true"}
    if model == "tensorrt_llm":
        return {"gpt_model_path": "1/engine", "gpt_model_type": "inflight_fused_batching",
                "tokenizer_dir": "1/engine", "exclude_input_in_output": "true",
                "max_tokens_cap": str(cfg.serving.max_tokens_cap)}
    return {}


def model_config(model: str, cfg: Config) -> mc.ModelConfig:
    """The `ModelConfig` message of one of MODELS."""
    conf = mc.ModelConfig(name=model, max_batch_size=cfg.build.max_batch_size)
    for spec in specs(model, "in"):
        tensor = conf.input.add(name=spec.name, data_type=mc.DataType.Value(spec.dtype), dims=spec.dims,
                                optional=spec.optional, allow_ragged_batch=spec.ragged)
        if spec.reshape is not None:
            tensor.reshape.SetInParent()
            tensor.reshape.shape.extend(spec.reshape)
    for spec in specs(model, "out"):
        conf.output.add(name=spec.name, data_type=mc.DataType.Value(spec.dtype), dims=spec.dims)
    if model == "ensemble":
        conf.platform = "ensemble"
        for name, inputs, outputs in STEPS:
            step = conf.ensemble_scheduling.step.add(model_name=name, model_version=-1)
            step.input_map.update(inputs)
            step.output_map.update(outputs)
        return conf
    conf.backend = "python"
    conf.model_transaction_policy.decoupled = model in DECOUPLED
    conf.dynamic_batching.SetInParent()
    conf.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    for key, value in parameters(model, cfg).items():
        conf.parameters[key].string_value = value
    return conf


def copy_tokenizer(engine_dir: Path, dest: Path) -> int:
    names = [n for n in (*TOKENIZER_FILES, "config.json") if (engine_dir / n).is_file()]
    if not {"tokenizer.json", "tokenizer.model", "vocab.json"} & set(names):
        raise PipelineError(f"No tokenizer files in the engine folder {engine_dir} - rebuild it with 'lpx build' "
                            "(set model.tokenizer if the checkpoint has none)")
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(engine_dir / name, dest / name)
    return len(names)


def source_models() -> Path:
    return Path(str(resources.files("model_repo")))


def write_repository(dest: Path, engine_dir: Path, cfg: Config) -> dict:
    """Write the four models into `dest` (replacing any earlier copy of them); returns a summary."""
    dest, engine_dir = Path(dest), Path(engine_dir)
    if cfg.build.target != "torch":
        raise PipelineError(f"build.target '{cfg.build.target}' needs TensorRT-LLM's Triton backend, which this "
                            "LPX release does not package yet - set build.target: torch")
    meta = read_meta(engine_dir)
    src = source_models()
    files = 0
    for model in MODELS:
        folder = dest / model
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(HEADER + text_format.MessageToString(model_config(model, cfg)),
                                             encoding="utf-8")
        files += 1
        if model in SOURCES:
            code = src / SOURCES[model] / "model.py"
            if not code.is_file():
                raise PipelineError(f"LPX's Triton model {code} is missing - reinstall LPX")
            shutil.copy2(code, folder / "1" / "model.py")
            files += 1
        if model in ("preprocessing", "postprocessing"):
            files += copy_tokenizer(engine_dir, folder / "1" / "tokenizer")
        if model == "tensorrt_llm":
            files += link_tree(engine_dir, folder / "1" / "engine")[0]
    return {"models": list(MODELS), "files": files, "format": meta["format"],
            "max_batch_size": cfg.build.max_batch_size, "decoupled": sorted(DECOUPLED)}
