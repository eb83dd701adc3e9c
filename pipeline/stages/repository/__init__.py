"""The repo stage: write the Triton model repository of one built variant. This package owns the stage's
key (`inputs`), its checks and its run:

  __init__.py       inputs / run / write_repository: what goes into each model's folder
  model_configs.py  the ModelConfig of LPX's python models and the ensemble, and their parameters
  engine_repo.py    the engine target's `tensorrt_llm` model (upstream's C++ tensorrtllm backend)
  xgrammar_info.py  the engine target's xgrammar tokenizer info (guided decoding in the C++ backend)
  pbtxt.py          tensors from LPX's table into a ModelConfig; the config.pbtxt text

Layout:

    preprocessing/   config.pbtxt, 1/model.py, 1/tokenizer/...
    tensorrt_llm/    config.pbtxt, 1/model.py (LPX's torch engine), 1/engine/... (hard links)
                     - engine target: backend `tensorrtllm` (no model.py), see engine_repo.py;
                       1/xgrammar_tokenizer_info.json where its backend version takes guides
                     - llmapi target: 1/model.py is model_repo/llmapi (tensorrt_llm.LLM), 1/engine the
                       llmapi build folder
    postprocessing/  config.pbtxt, 1/model.py, 1/tokenizer/...
    ensemble/        config.pbtxt, 1/
    tensorrt_llm_bls/ config.pbtxt, 1/model.py - LPX's BLS model: the ensemble's request tensors, calling
                     preprocessing, tensorrt_llm (streamed) and postprocessing itself

Key: the build artifact's key, every config.pbtxt as it will be written (the engine target's absolute
gpt_model_path and xgrammar_tokenizer_info_path left as placeholders), the python models copied from
model_repo/, the code of the modules that write the configs, and the sha256 of the engine target's
xgrammar tokenizer info (its content: a tokenizer that changes changes the key). serving.max_tokens_cap,
build.max_batch_size and the rest reach the key through the config.pbtxt texts they shape.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ...artifacts import Artifact, link_tree
from ...cache_keys import code_fingerprint, file_fingerprint
from ...config import Config, Variant
from ...errors import LpxError
from ...facts import trtllm
from ...inspection.checkpoint import TOKENIZER_FILES
from ...runtime.engines.llmapi_engine import read_build
from ...runtime.engines.torch_meta import read_meta
from ...runtime.engines.vllm_engine import read_build as read_vllm_build
from ..context import Context
from . import engine_repo, xgrammar_info
from .model_configs import DECOUPLED, ENGINE_SOURCES, MODELS, SOURCES, model_config
from .pbtxt import HEADER, text

CODE = (
    "pipeline.stages.repository",
    "pipeline.stages.repository.model_configs",
    "pipeline.stages.repository.engine_repo",
    "pipeline.stages.repository.pbtxt",
    "pipeline.stages.repository.proto",
    "pipeline.stages.repository.xgrammar_info",
    "pipeline.runtime.tensors",
    "pipeline.runtime.upstream_io",
    "pipeline.runtime.upstream_trtllm",
)
ENGINE_PATH_IN_KEY = Path("<repository>/tensorrt_llm/1/engine")  # where the engine target's copy will be


@dataclass
class Source:
    """What a repository is written from: the format and prompt limit the engine was built with, and
    where the tokenizer files are; for the engine target, its xgrammar tokenizer info (JSON text), or
    why guided decoding stays off."""

    fmt: str | None
    max_input_len: int
    tokenizer: Path
    tokenizer_hint: str | None
    xgrammar: str | None = None
    guides_off: str | None = None


def check_llmapi(options: dict, cfg: Config) -> None:
    """Cross-checks of the Triton config against the llmapi build's LLM-API options."""
    engine_repo.check_batch_fits(cfg, options.get("max_batch_size"), "the llmapi build's max_batch_size")
    seq, inp = options.get("max_seq_len"), options.get("max_input_len")
    if seq is not None and inp is not None and int(inp) >= int(seq):
        raise LpxError(
            f"The llmapi build's max_input_len {inp} leaves no room for output in max_seq_len {seq} "
            "- rebuild with build.max_input_len below build.max_seq_len"
        )


def check_limits(target: str, built, cfg: Config) -> None:
    """Triton's max_batch_size against the sequences the build lets the engine hold at once."""
    if built is not None and cfg.build.max_batch_size > int(built):
        raise LpxError(
            f"Triton max_batch_size {cfg.build.max_batch_size} (build.max_batch_size) exceeds the "
            f"{target} build's {built} - lower build.max_batch_size to {built} or rebuild with 'lpx build'"
        )


def copy_tokenizer(engine_dir: Path, dest: Path, hint: str | None = None) -> int:
    names = [
        n for n in (*TOKENIZER_FILES, "config.json", "generation_config.json") if (engine_dir / n).is_file()
    ]
    if not {"tokenizer.json", "tokenizer.model", "vocab.json"} & set(names):
        raise LpxError(
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


def source(cfg: Config, engine_dir: Path, tokenizer_dir: Path | None = None) -> Source:
    """Read (and check against cfg) the build output a repository is written from.

    tokenizer_dir: where the tokenizer files are (default: engine_dir, which holds them for the torch
    target; a trtllm-build engine folder has none - pass the quantize artifact's tokenizer/ folder)."""
    engine_dir = Path(engine_dir)
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
            raise LpxError(
                f"The engine folder {engine_dir} has no tokenizer - pass the tokenizer folder "
                "(the quantize artifact's tokenizer/ folder)"
            )
    elif target == "llmapi":
        meta, options = read_build(engine_dir)
        check_llmapi(options, cfg)
        fmt, max_input_len = meta.get("format"), options.get("max_input_len") or cfg.build.max_input_len
        tokenizer_dir = tokenizer_dir if tokenizer_dir is not None else engine_dir / str(meta["model"])
    elif target == "vllm":
        meta = read_vllm_build(engine_dir)
        check_limits("vllm", meta["engine_args"].get("max_num_seqs"), cfg)
        fmt, max_input_len = meta.get("format"), meta.get("max_input_len") or cfg.build.max_input_len
        tokenizer_dir = tokenizer_dir if tokenizer_dir is not None else engine_dir / str(meta["model"])
    else:
        raise LpxError(
            f"build.target '{target}' has no Triton repository - set build.target: torch, engine, llmapi or vllm"
        )
    hint = (
        None
        if tokenizer_dir is None
        else f"No tokenizer files in {tokenizer_dir} - pass the folder that holds them"
    )
    src = Source(
        fmt, int(max_input_len), Path(tokenizer_dir) if tokenizer_dir is not None else engine_dir, hint
    )
    if target == "engine":
        src.xgrammar, src.guides_off = guides(cfg, src.tokenizer)
    return src


def guides(cfg: Config, tokenizer_dir: Path) -> tuple[str | None, str | None]:
    """The engine target's xgrammar tokenizer info (JSON text) and, without one, why guided decoding
    stays off (the gateway then answers guides with a 400 naming the parameters)."""
    if not engine_repo.takes_guides(cfg):
        return None, (
            f"the TensorRT-LLM {cfg.build.trtllm_version} line's tensorrt_llm model has no guided decoding"
        )
    try:
        return xgrammar_info.text(tokenizer_dir), None
    except xgrammar_info.Unavailable as exc:
        return None, exc.message


def configs(cfg: Config, src: Source, engine_path: Path) -> dict[str, str]:
    """model -> its config.pbtxt text (engine_path: the engine target's absolute copy of the engine; its
    xgrammar tokenizer info lies beside it)."""
    info = engine_path.parent / xgrammar_info.FILENAME if src.xgrammar is not None else None
    return {model: text(model_config(model, cfg, engine_path, src.max_input_len, info)) for model in MODELS}


def write_repository(dest: Path, engine_dir: Path, cfg: Config, tokenizer_dir: Path | None = None) -> dict:
    """Write the five models into `dest` (replacing any earlier copy of them); returns a summary."""
    dest, engine_dir = Path(dest), Path(engine_dir)
    target = cfg.build.target
    src = source(cfg, engine_dir, tokenizer_dir)
    texts = configs(cfg, src, (dest / "tensorrt_llm" / "1" / "engine").resolve())
    models = source_models()
    files = 0
    for model in MODELS:
        folder = dest / model
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(HEADER + texts[model], encoding="utf-8")
        files += 1
        code_dir = ENGINE_SOURCES.get(target) if model == "tensorrt_llm" else SOURCES.get(model)
        if code_dir is not None:
            code = models / code_dir / "model.py"
            if not code.is_file():
                raise LpxError(f"LPX's Triton model {code} is missing - reinstall LPX")
            shutil.copy2(code, folder / "1" / "model.py")
            files += 1
        if model in ("preprocessing", "postprocessing"):
            files += copy_tokenizer(src.tokenizer, folder / "1" / "tokenizer", src.tokenizer_hint)
        if model == "tensorrt_llm":
            files += link_tree(engine_dir, folder / "1" / "engine")[0]
            if src.xgrammar is not None:
                (folder / "1" / xgrammar_info.FILENAME).write_text(src.xgrammar, encoding="utf-8")
                files += 1
    summary = {
        "models": list(MODELS),
        "files": files,
        "format": src.fmt,
        "max_batch_size": cfg.build.max_batch_size,
        "decoupled": sorted(DECOUPLED),
    }
    if target == "engine":
        summary["backend"] = "tensorrtllm"
        summary["contract_version"] = trtllm.contract_version(cfg.build.trtllm_version)
        summary["guided_decoding"] = (
            engine_repo.GUIDED_DECODING_BACKEND if src.xgrammar is not None else f"off: {src.guides_off}"
        )
    return summary


def tokenizer_of(cfg: Config, checkpoint: Artifact | None) -> Path | None:
    """The engine target's tokenizer: the quantize artifact's tokenizer/ (an engine folder holds none;
    before quantize wrote tokenizer/, state/ had it). Other targets: None (the build folder has it)."""
    if checkpoint is None or cfg.build.target != "engine":
        return None
    tokenizer = checkpoint.path / "tokenizer"
    return tokenizer if tokenizer.is_dir() else checkpoint.path / "state"


def inputs(ctx: Context, variant: Variant, engine: Artifact, checkpoint: Artifact | None = None) -> dict:
    """The key's inputs (see the module docstring)."""
    cfg = ctx.cfg
    models = source_models()
    src = source(cfg, engine.path, tokenizer_of(cfg, checkpoint))
    key = {
        "engine_key": engine.key,
        "config.pbtxt": configs(cfg, src, ENGINE_PATH_IN_KEY),
        "model_repo": file_fingerprint(models) if models.is_dir() else {},
        "code": code_fingerprint(CODE),
    }
    if src.xgrammar is not None:
        key["xgrammar_tokenizer_info"] = xgrammar_info.digest(src.xgrammar)
    return key


def run(ctx: Context, variant: Variant, engine: Artifact, checkpoint: Artifact | None, out: Path) -> dict:
    return write_repository(out, engine.path, ctx.cfg, tokenizer_dir=tokenizer_of(ctx.cfg, checkpoint))
