"""The build stage: turn a quantized checkpoint into what a server loads, per build target. This package
owns the stage's key (`inputs`), its checks and its run:

  __init__.py       check / inputs / run / dry_run, dispatching on build.target
  engine_target.py  `engine`: trtllm-build per GPU arch (trtllm_build.py composes the command line,
                    trtllm_run.py runs it as a child process)
  llmapi.py         `llmapi`: the unified HF checkpoint + LLM-API options for TensorRT-LLM's LLM API
  torch_target.py   `torch`: LPX's reference engine folder (ModelOpt state + runtime limits)
  vllm_target.py    `vllm`: the unified HF checkpoint + vLLM's engine arguments (lpx_vllm.json)

Key per target: the quantize artifact's key, the target (arch and TensorRT-LLM line where they matter),
what the build generates - the trtllm-build argv with its paths left out, the LLM-API options and
model.yaml, or lpx_engine.json - the TensorRT-LLM version that builds engines, and the code of the
target's modules. build.timeout_s and build.gpu shape nothing and are left out.
"""

from __future__ import annotations

from pathlib import Path

from ... import toolchain
from ...artifacts import Artifact
from ...cache_keys import code_fingerprint
from ...config import Variant, serving_refusal
from ...errors import LpxError, UsageError
from ...facts import trtllm
from ...facts.formats import LINE_TARGETS, refusal, sm_number, unknown_algo
from ..context import ANY_ARCH, Context
from ..quantize.model_io import STATE_FILE
from . import engine_target, llmapi, torch_target, vllm_target
from .trtllm_build import key_argv

# The modules that write each target's output (their fingerprint is part of the key).
CODE = {
    "engine": ("pipeline.stages.build.engine_target", "pipeline.stages.build.trtllm_build"),
    "llmapi": ("pipeline.stages.build.llmapi",),
    "torch": ("pipeline.stages.build.torch_target", "pipeline.runtime.engines.torch_meta"),
    "vllm": ("pipeline.stages.build.vllm_target",),
}
NEEDS = {"engine": "trtllm/config.json", "torch": f"state/{STATE_FILE}"}  # llmapi.write_llmapi checks its own


def archs(ctx: Context) -> list[str]:
    """The slots a variant is built in: one per GPU arch for trtllm-build engines; torch and llmapi
    artifacts run on any of the configured archs."""
    b = ctx.cfg.build
    return list(b.archs) if b.target == "engine" else [ANY_ARCH]


def check(ctx: Context, variant: Variant) -> None:
    """Before any work: the format on every build arch and in the targeted TensorRT-LLM line, the
    sequence length against the model's positions, and weights + one full sequence against the GPU."""
    from ...inspection.plan import check_fit

    b, q = ctx.cfg.build, variant.quantization
    where = f"variant '{variant.name}'"
    why = serving_refusal(b, variant)  # the config refused it already; a config built in code is checked here
    if why:
        raise UsageError(f"{where}: {why}")
    for arch in b.archs:
        why = refusal(q.format, q.kv_cache, sm=sm_number(arch))
        if why:
            raise UsageError(
                f"{where}: {why}, but build.archs lists {arch} - "
                f"drop {arch} from build.archs or choose another format for it"
            )
    why = unknown_algo(q.format, q.kv_cache, b.trtllm_version) if b.target in LINE_TARGETS else None
    if why:
        raise UsageError(
            f"{where}: {why} - set build.trtllm_version: {trtllm.default_line(b.target)} or choose another format"
        )
    info, _ = ctx.checkpoint()
    if info.max_positions and b.max_seq_len > info.max_positions:
        raise UsageError(
            f"build.max_seq_len {b.max_seq_len} exceeds the model's max_position_embeddings "
            f"{info.max_positions} - lower build.max_seq_len"
        )
    kv = {"none": "bf16"}.get(q.kv_cache, q.kv_cache)
    for gpu in target_gpus(ctx):
        check_fit(info.config, q.format, kv, b.max_seq_len, b.tp_size * b.pp_size, gpu, where)


def target_gpus(ctx: Context) -> list:
    """GPUs to check memory against: build.gpu, else the GPU present when its arch is a build target."""
    from ...facts.gpu import detect_gpu, lookup_gpu

    def find() -> list:
        b = ctx.cfg.build
        if b.gpu:
            try:
                return [lookup_gpu(b.gpu)]
            except LpxError as exc:
                raise UsageError(f"build.gpu: {exc.message}") from None
        if b.target != "engine":
            return []
        present = detect_gpu()
        if present is None or present.arch not in b.archs:
            return []
        try:
            return [lookup_gpu(present.name)]
        except LpxError:
            ctx.report.warn(f"{present.name} is not in LPX's GPU table: memory fit not checked")
            return []

    return ctx.cached(f"target_gpus:{ctx.cfg.build.target}", find)


def inputs(ctx: Context, variant: Variant, checkpoint: Artifact, arch: str) -> dict:
    """The key's inputs for build.target (see the module docstring)."""
    cfg = ctx.cfg
    target = cfg.build.target
    out: dict = {"checkpoint_key": checkpoint.key}
    if target == "engine":
        argv, _ = engine_target.command(cfg, variant, checkpoint.path, arch, Path("<engine>"))
        out["target"] = {"target": target, "arch": arch, "trtllm_version": cfg.build.trtllm_version}
        out["trtllm-build argv"] = key_argv(argv)
        out["versions"] = toolchain.versions("tensorrt_llm")
    elif target == "llmapi":
        out["target"] = {"target": target, "trtllm_version": cfg.build.trtllm_version}
        out["llm_api_options"] = llmapi.llmapi_options(cfg, variant)
        out["model.yaml"] = llmapi.model_file(cfg, variant)
    elif target == "vllm":
        out["target"] = {"target": target, "vllm_version": vllm_target.VLLM_VERSION}
        info, _ = ctx.checkpoint()
        out["lpx_vllm.json"] = vllm_target.build_file(cfg, variant, info.config)
    else:
        out["target"] = {"target": target}
        out["lpx_engine.json"] = torch_target.engine_meta(cfg, variant)
    out["code"] = code_fingerprint(CODE[target])
    return out


def run(ctx: Context, variant: Variant, checkpoint: Artifact, arch: str, out: Path) -> dict:
    """Build the variant for `arch` into `out`; returns the manifest's results."""
    cfg = ctx.cfg
    target = cfg.build.target
    if target in NEEDS and not (checkpoint.path / NEEDS[target]).is_file():
        raise LpxError(
            f"The quantize artifact {checkpoint.path} has no {NEEDS[target]} (build.target {target} reads it) - "
            f"re-run 'lpx quantize' for variant '{variant.name}'"
        )
    if target == "engine":
        return engine_target.run(cfg, variant, checkpoint, arch, out, ctx.report)
    if target == "llmapi":
        return llmapi.write_llmapi(cfg, variant, checkpoint.path, out)
    if target == "vllm":
        return vllm_target.write_vllm(cfg, variant, checkpoint.path, out, ctx.checkpoint()[0].config)
    return torch_target.run(cfg, variant, checkpoint, out)


def dry_run(ctx: Context, variant: Variant, checkpoint: Artifact, arch: str, out: Path) -> list[str]:
    """What `lpx build --dry-run` prints: the trtllm-build command and why each flag is set."""
    if ctx.cfg.build.target != "engine":
        return [f"dry run: target {ctx.cfg.build.target} runs no build tool"]
    argv, reasons = engine_target.command(ctx.cfg, variant, checkpoint.path, arch, out)
    return ["dry run (nothing is built):", "  " + " ".join(argv)] + [
        f"    {flag:<28} {why}" for flag, why in reasons.items()
    ]
