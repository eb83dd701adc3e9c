"""The `engine` target's command line: compose `trtllm-build` from the config, with a reason for every flag.

Every flag and value is checked against the targeted TensorRT-LLM line (build.trtllm_version; its
contract name, "latest" or "v0.16.0", from pipeline/facts/trtllm.py); FLAGS is the subset of
tests/contracts/trtllm_build_flags.json that LPX uses, and tests/test_trtllm_build.py checks it against
that contract. The composed argv, with its paths left out (`key_argv`), is part of the build key.
Running it is trtllm_run.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...config import Config
from ...errors import LpxError, UsageError
from ...facts import trtllm
from ...facts.formats import FORMATS, unknown_algo
from .torch_target import TOKENS_PER_BLOCK

SMALL_BATCH_FP8_GEMM = 4  # upstream: the FP8 GEMM plugin helps small batches (<= 4), hurts larger ones
FP8_CONTEXT_FMHA_ALGOS = {"FP8", "W4A8_AWQ", "NVFP4"}  # quant_algo values with FP8 context FMHA

# The flags LPX passes and their legal choices (None: a positive int or a path), per contract version.
_ON_OFF = ("enable", "disable")
_COMMON: dict[str, tuple[str, ...] | None] = {
    "--checkpoint_dir": None,
    "--output_dir": None,
    "--max_batch_size": None,
    "--max_input_len": None,
    "--max_seq_len": None,
    "--max_num_tokens": None,
    "--remove_input_padding": _ON_OFF,
    "--gpt_attention_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "disable"),
    "--context_fmha": _ON_OFF,
    "--multiple_profiles": _ON_OFF,
    "--workers": None,
    "--input_timing_cache": None,
    "--output_timing_cache": None,
    "--tokens_per_block": None,
    "--use_paged_context_fmha": _ON_OFF,
    "--use_fp8_context_fmha": _ON_OFF,
}
FLAGS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "latest": {
        **_COMMON,
        "--kv_cache_type": ("continuous", "paged", "disabled"),
        "--gemm_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"),
    },
    "v0.16.0": {
        **_COMMON,
        # v0.16.0 parses --kv_cache_type with the C++ binding enum (contract note); the string flag
        # --paged_kv_cache (deprecated, still accepted) is the spelling that is safe there.
        "--paged_kv_cache": _ON_OFF,
        "--gemm_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "disable"),
    },
}
# Flags whose value is a path of this machine: the build key holds a placeholder instead (the output
# does not depend on where it is written); a reused timing cache only makes the build faster.
PATH_FLAGS = {
    "--checkpoint_dir": "<quantize>/trtllm",
    "--output_dir": "<engine>",
    "--output_timing_cache": "<timing cache>",
}
UNKEYED_FLAGS = ("--input_timing_cache",)


def _checkpoint_world_size(checkpoint_dir: Path) -> int | None:
    try:
        mapping = json.loads((Path(checkpoint_dir) / "config.json").read_text()).get("mapping") or {}
    except (OSError, ValueError):
        return None
    return int(mapping.get("world_size") or int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1)))


def compose(
    cfg: Config,
    variant_format: str,
    checkpoint_dir: Path,
    output_dir: Path,
    timing_cache: Path,
    version: str,
    kv_cache: str = "none",
) -> tuple[list[str], dict[str, str]]:
    """The `trtllm-build` argv (argv[0] is 'trtllm-build') and a reason for every flag it sets.

    `version` is build.trtllm_version ('1.2' or '0.16'); `kv_cache` the variant's KV-cache type.
    Raises LpxError for a format, limit or flag the targeted version does not accept.
    """
    algo = _validate(cfg, variant_format, checkpoint_dir, version)
    v = trtllm.line(version).contract
    world = cfg.build.tp_size * cfg.build.pp_size
    args = _limit_args(cfg, checkpoint_dir, output_dir, v)
    args += _kernel_args(cfg, variant_format, kv_cache, algo)
    args += [
        ("--multiple_profiles", "enable", "several TensorRT profiles: faster across batch sizes"),
        ("--tokens_per_block", TOKENS_PER_BLOCK, "KV block size shared with the torch target"),
        ("--workers", world, "one build worker per rank"),
    ]
    if Path(timing_cache).is_file():
        args.append(("--input_timing_cache", timing_cache, "reuse kernel timings from earlier builds"))
    args.append(("--output_timing_cache", timing_cache, "keep kernel timings for the next build"))

    table = FLAGS[v]
    argv, reasons = ["trtllm-build"], {}
    for flag, value, reason in args:
        _check(v, table, flag, value)
        argv += [flag, str(value)]
        reasons[flag] = reason
    return argv, reasons


def _validate(cfg: Config, variant_format: str, checkpoint_dir: Path, version: str) -> str | None:
    """The format's QuantAlgo, once the line builds engines, knows the format, and the limits and the
    checkpoint's ranks agree with the build section; a UsageError naming the fix otherwise."""
    trtllm.line(version)  # a line LPX builds for, or the error naming them
    b = cfg.build
    why = trtllm.target_refusal("engine", version)
    if why:
        raise UsageError(why)
    algo = FORMATS[variant_format].quant_algo
    why = unknown_algo(variant_format, "none", version)
    if why:
        raise UsageError(f"{why} - set build.trtllm_version: {trtllm.newest_with(algo)}")
    if b.max_input_len > b.max_seq_len:
        raise UsageError(
            f"build.max_input_len {b.max_input_len} exceeds build.max_seq_len {b.max_seq_len} - "
            "trtllm-build would clip it; lower max_input_len"
        )
    world = b.tp_size * b.pp_size
    ckpt_world = _checkpoint_world_size(checkpoint_dir)
    if ckpt_world is not None and ckpt_world != world:
        raise UsageError(
            f"checkpoint {checkpoint_dir} was exported for {ckpt_world} rank(s) but build.tp_size x "
            f"pp_size = {world} - re-run 'lpx quantize' after changing tp_size/pp_size"
        )
    return algo


def _limit_args(cfg: Config, checkpoint_dir: Path, output_dir: Path, v: str) -> list[tuple[str, object, str]]:
    """Paths, limits and the batching layout (paged KV cache, packed inputs, attention plugin)."""
    b = cfg.build
    args: list[tuple[str, object, str]] = [
        ("--checkpoint_dir", checkpoint_dir, "the TensorRT-LLM checkpoint exported by 'lpx quantize'"),
        (
            "--output_dir",
            output_dir,
            "the artifact store's temporary folder, renamed into place when complete",
        ),
        (
            "--max_batch_size",
            b.max_batch_size,
            "build.max_batch_size (upstream default 2048 over-sizes buffers)",
        ),
        ("--max_input_len", b.max_input_len, "build.max_input_len"),
        (
            "--max_seq_len",
            b.max_seq_len,
            "build.max_seq_len (unset, trtllm-build sizes the KV cache for max_position_embeddings)",
        ),
        ("--max_num_tokens", b.max_num_tokens, "build.max_num_tokens: tokens per in-flight batch step"),
    ]
    if v == "latest":
        args.append(("--kv_cache_type", "paged", "paged KV cache for in-flight batching"))
    else:
        args.append(("--paged_kv_cache", "enable", "paged KV cache for in-flight batching (0.16 spelling)"))
    return args + [
        ("--remove_input_padding", "enable", "packed inputs, required by in-flight batching"),
        ("--gpt_attention_plugin", "auto", "attention plugin in the checkpoint dtype (needed for paged KV)"),
        ("--context_fmha", "enable", "fused attention in the context phase"),
    ]


def _kernel_args(
    cfg: Config, variant_format: str, kv_cache: str, algo: str | None
) -> list[tuple[str, object, str]]:
    """The GEMM plugin and the context-attention kernels the format and KV-cache type allow."""
    args: list[tuple[str, object, str]] = []
    if variant_format == "nvfp4":
        args.append(("--gemm_plugin", "nvfp4", "NVFP4 checkpoint: the NVFP4 GEMM plugin"))
    elif variant_format == "fp8" and cfg.build.max_batch_size <= SMALL_BATCH_FP8_GEMM:
        args.append(("--gemm_plugin", "fp8", f"FP8 GEMM plugin: faster for batch <= {SMALL_BATCH_FP8_GEMM}"))
    else:
        why = "TensorRT FP8 GEMMs for the quantized layers" if variant_format == "fp8" else "plugin GEMMs"
        args.append(("--gemm_plugin", "auto", f"GEMM plugin in the checkpoint dtype ({why})"))
    if kv_cache == "int8":
        why = "INT8 KV cache: TensorRT-LLM refuses paged context FMHA (no chunked context / KV reuse)"
        args.append(("--use_paged_context_fmha", "disable", why))
    elif kv_cache == "fp8" and algo != "FP8":
        why = (
            f"FP8 KV cache with format '{variant_format}': "
            "TensorRT-LLM allows paged context FMHA only with FP8 weights (no chunked context / KV reuse)"
        )
        args.append(("--use_paged_context_fmha", "disable", why))
    else:
        args.append(("--use_paged_context_fmha", "enable", "needed for chunked context and KV-cache reuse"))
    if algo in FP8_CONTEXT_FMHA_ALGOS:
        args.append(("--use_fp8_context_fmha", "enable", f"{algo} checkpoint: FP8 context attention (sm89+)"))
    else:
        args.append(
            ("--use_fp8_context_fmha", "disable", f"format '{variant_format}' has no FP8 context FMHA")
        )
    return args


def _check(v: str, table: dict, flag: str, value: object) -> None:
    if flag not in table:
        raise LpxError(
            f"trtllm-build {v} has no flag {flag} - set build.trtllm_version to a line that has it"
        )
    choices = table[flag]
    if choices is not None and str(value) not in choices:
        raise LpxError(f"trtllm-build {v}: {flag} {value} is not one of {', '.join(choices)}")
    if choices is None and isinstance(value, int) and value < 1:
        raise LpxError(f"trtllm-build {v}: {flag} must be a positive integer, not {value}")


def key_argv(argv: list[str]) -> list[str]:
    """The argv as the build key holds it: paths replaced by what they stand for, the timing cache input
    left out (it changes how fast the build runs, not what it writes)."""
    out, skip = [argv[0]], False
    for i, token in enumerate(argv[1:], 1):
        if skip:
            skip = False
            continue
        if token in UNKEYED_FLAGS:
            skip = True
            continue
        prev = argv[i - 1]
        out.append(PATH_FLAGS.get(prev, token) if prev in PATH_FLAGS else token)
    return out
