"""The `engine` target: compose a `trtllm-build` command line, run it, and record the toolchain.

Every flag and value is checked against the targeted TensorRT-LLM line (1.2.x = "latest", or
0.16); the tables below are the subset of tests/contracts/trtllm_build_flags.json that LPX
uses, and tests/test_trtllm_build.py checks them against that contract.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from ...config import Config
from ...errors import PipelineError
from ..quantize.recipes import QUANT_ALGO

BINARY_ENV = "LPX_TRTLLM_BUILD"
TOKENS_PER_BLOCK = 32  # same block size as the torch target (pipeline/stages/build.py)
SMALL_BATCH_FP8_GEMM = 4  # upstream: the FP8 GEMM plugin helps small batches (<= 4), hurts larger ones
FP8_CONTEXT_FMHA_ALGOS = {"FP8", "W4A8_AWQ", "NVFP4"}  # quant_algo values with FP8 context FMHA
LOG_TAIL_LINES = 40

# The flags LPX passes: flag -> (legal choices or None for a positive int / path, default).
_COMMON: dict[str, tuple[tuple[str, ...] | None, object]] = {
    "--checkpoint_dir": (None, None),
    "--output_dir": (None, "engine_outputs"),
    "--max_batch_size": (None, 2048),
    "--max_input_len": (None, 1024),
    "--max_seq_len": (None, None),
    "--max_num_tokens": (None, 8192),
    "--remove_input_padding": (("enable", "disable"), "enable"),
    "--gpt_attention_plugin": (("auto", "float16", "float32", "bfloat16", "int32", "disable"), "auto"),
    "--context_fmha": (("enable", "disable"), "enable"),
    "--multiple_profiles": (("enable", "disable"), "disable"),
    "--workers": (None, 1),
    "--input_timing_cache": (None, None),
    "--output_timing_cache": (None, "model.cache"),
}
FLAGS: dict[str, dict[str, tuple[tuple[str, ...] | None, object]]] = {
    "latest": {
        **_COMMON,
        "--kv_cache_type": (("continuous", "paged", "disabled"), None),
        "--gemm_plugin": (
            ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"),
            None,
        ),
        "--tokens_per_block": (None, 32),
        "--use_paged_context_fmha": (("enable", "disable"), "enable"),
        "--use_fp8_context_fmha": (("enable", "disable"), "enable"),
    },
    "v0.16.0": {
        **_COMMON,
        # v0.16.0 parses --kv_cache_type with the C++ binding enum (contract note); the string flag
        # --paged_kv_cache (deprecated, still accepted) is the spelling that is safe there.
        "--paged_kv_cache": (("enable", "disable"), None),
        "--gemm_plugin": (("auto", "float16", "float32", "bfloat16", "int32", "fp8", "disable"), "disable"),
        "--tokens_per_block": (None, 64),
        "--use_paged_context_fmha": (("enable", "disable"), "disable"),
        "--use_fp8_context_fmha": (("enable", "disable"), "disable"),
    },
}
VERSION_NAMES = {"1.2": "latest", "latest": "latest", "0.16": "v0.16.0", "v0.16.0": "v0.16.0"}


def contract_version(version: str) -> str:
    """'1.2' -> 'latest', '0.16' -> 'v0.16.0' (the names used by the flags contract)."""
    try:
        return VERSION_NAMES[version]
    except KeyError:
        raise PipelineError(
            f"Unknown TensorRT-LLM version '{version}' - set build.trtllm_version to 1.2 or 0.16", exit_code=2
        ) from None


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
    Raises PipelineError for a format, limit or flag the targeted version does not accept.
    """
    v = contract_version(version)
    b = cfg.build
    if variant_format not in QUANT_ALGO:
        raise PipelineError(
            f"Unknown quantization format '{variant_format}' - use one of {', '.join(QUANT_ALGO)}", 2
        )
    algo = QUANT_ALGO[variant_format]
    if variant_format == "nvfp4" and v != "latest":
        raise PipelineError(
            "format 'nvfp4' needs TensorRT-LLM 1.2 (0.16 has no NVFP4 GEMM plugin) - "
            "set build.trtllm_version: 1.2",
            exit_code=2,
        )
    if b.max_input_len > b.max_seq_len:
        raise PipelineError(
            f"build.max_input_len {b.max_input_len} exceeds build.max_seq_len {b.max_seq_len} - "
            "trtllm-build would clip it; lower max_input_len",
            exit_code=2,
        )
    world = b.tp_size * b.pp_size
    ckpt_world = _checkpoint_world_size(checkpoint_dir)
    if ckpt_world is not None and ckpt_world != world:
        raise PipelineError(
            f"checkpoint {checkpoint_dir} was exported for {ckpt_world} rank(s) but build.tp_size x "
            f"pp_size = {world} - re-run 'lpx quantize' after changing tp_size/pp_size",
            exit_code=2,
        )

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
    args += [
        ("--remove_input_padding", "enable", "packed inputs, required by in-flight batching"),
        ("--gpt_attention_plugin", "auto", "attention plugin in the checkpoint dtype (needed for paged KV)"),
        ("--context_fmha", "enable", "fused attention in the context phase"),
    ]
    if variant_format == "nvfp4":
        args.append(("--gemm_plugin", "nvfp4", "NVFP4 checkpoint: the NVFP4 GEMM plugin"))
    elif variant_format == "fp8" and b.max_batch_size <= SMALL_BATCH_FP8_GEMM:
        args.append(("--gemm_plugin", "fp8", f"FP8 GEMM plugin: faster for batch <= {SMALL_BATCH_FP8_GEMM}"))
    else:
        why = "TensorRT FP8 GEMMs for the quantized layers" if variant_format == "fp8" else "plugin GEMMs"
        args.append(("--gemm_plugin", "auto", f"GEMM plugin in the checkpoint dtype ({why})"))
    if kv_cache == "int8":
        args.append(
            (
                "--use_paged_context_fmha",
                "disable",
                "INT8 KV cache: TensorRT-LLM refuses paged context FMHA (no chunked context / KV reuse)",
            )
        )
    elif kv_cache == "fp8" and algo != "FP8":
        args.append(
            (
                "--use_paged_context_fmha",
                "disable",
                f"FP8 KV cache with format '{variant_format}': "
                "TensorRT-LLM allows paged context FMHA only with FP8 weights (no chunked context / KV reuse)",
            )
        )
    else:
        args.append(("--use_paged_context_fmha", "enable", "needed for chunked context and KV-cache reuse"))
    if algo in FP8_CONTEXT_FMHA_ALGOS:
        args.append(("--use_fp8_context_fmha", "enable", f"{algo} checkpoint: FP8 context attention (sm89+)"))
    else:
        args.append(
            ("--use_fp8_context_fmha", "disable", f"format '{variant_format}' has no FP8 context FMHA")
        )
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


def _check(v: str, table: dict, flag: str, value: object) -> None:
    if flag not in table:
        raise PipelineError(
            f"trtllm-build {v} has no flag {flag} - set build.trtllm_version to a line that has it"
        )
    choices, _default = table[flag]
    if choices is not None and str(value) not in choices:
        raise PipelineError(f"trtllm-build {v}: {flag} {value} is not one of {', '.join(choices)}")
    if choices is None and isinstance(value, int) and value < 1:
        raise PipelineError(f"trtllm-build {v}: {flag} must be a positive integer, not {value}")


def find_binary(binary: str | None = None) -> list[str]:
    """The command that runs trtllm-build: `binary`, else $LPX_TRTLLM_BUILD, else trtllm-build on PATH."""
    spec = binary or os.environ.get(BINARY_ENV)
    if spec:
        cmd = shlex.split(spec)
        if cmd and (shutil.which(cmd[0]) or Path(cmd[0]).is_file()):
            return cmd
        raise PipelineError(
            f"{BINARY_ENV}={spec!r} does not name a program - point it at trtllm-build or unset it",
            exit_code=2,
        )
    found = shutil.which("trtllm-build")
    if not found:
        raise PipelineError(
            "trtllm-build is not on PATH - run inside the TensorRT-LLM 1.2 container, set "
            f"{BINARY_ENV}=/path/to/trtllm-build, or use build.target: torch",
            exit_code=2,
        )
    return [found]


def _tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the child's process group, SIGKILL it if still there after grace_s, then reap."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the group may outlive its leader: make sure nothing of it is left
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_build(
    argv: list[str],
    log_path: Path,
    timeout_s: float,
    binary: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> float:
    """Run trtllm-build (argv[0] is replaced by the resolved binary), stream its output to log_path
    and to progress(line), and return the elapsed seconds. Raises PipelineError, with the log tail
    in `detail`, on a non-zero exit or a timeout; the child's process group is killed on timeout
    and on KeyboardInterrupt."""
    cmd = find_binary(binary) + [str(a) for a in argv[1:]]
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=True,
            )
        except OSError as exc:
            raise PipelineError(
                f"cannot start {cmd[0]}: {exc} - check {BINARY_ENV} or PATH", exit_code=2
            ) from None

        def pump() -> None:  # keeps draining the pipe even if progress() fails, so the child never blocks
            assert proc.stdout is not None
            report = progress
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if report is not None:
                    try:
                        report(line.rstrip("\n"))
                    except Exception:
                        report = None

        reader = threading.Thread(target=pump, name="trtllm-build-log", daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            reader.join(timeout=5)
            raise PipelineError(
                f"trtllm-build did not finish within the {timeout_s:g} s timeout and was killed - "
                f"raise the build timeout or lower the build limits; log: {log_path}",
                detail=_tail(log_path),
            ) from None
        except BaseException:  # KeyboardInterrupt and friends: never leave a build running
            _kill_group(proc)
            reader.join(timeout=5)
            raise
        reader.join(timeout=30)
    elapsed = time.monotonic() - start
    if rc < 0:  # killed from outside, most often by the kernel's OOM killer
        raise PipelineError(
            f"trtllm-build was killed by {signal.Signals(-rc).name} (exit code {rc}) - if the machine "
            f"ran out of memory, lower build.max_batch_size/max_num_tokens or use fewer workers; log: "
            f"{log_path}",
            detail=_tail(log_path),
        )
    if rc != 0:
        raise PipelineError(
            f"trtllm-build failed (exit code {rc}) - see the log tail below or {log_path}",
            detail=_tail(log_path),
        )
    return elapsed


def _nvidia_smi() -> dict[str, str | None]:
    out = {"gpu": None, "sm": None, "driver": None}
    if not shutil.which("nvidia-smi"):
        return out
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return out
    first = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""
    parts = [p.strip() for p in first.split(",")]
    if len(parts) == 3:
        out = {"gpu": parts[0], "sm": "sm" + parts[1].replace(".", ""), "driver": parts[2]}
    return out


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cuda_version() -> str | None:
    try:
        import torch

        return torch.version.cuda
    except Exception:
        return None


def engine_versions() -> dict:
    """GPU, SM, driver, CUDA, TensorRT and TensorRT-LLM versions for the manifest (None where absent)."""
    return {
        **_nvidia_smi(),
        "cuda": _cuda_version(),
        "tensorrt": _version("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt_cu13", "tensorrt_cu12"),
        "tensorrt_llm": _version("tensorrt_llm", "tensorrt-llm"),
    }
