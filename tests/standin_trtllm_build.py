#!/usr/bin/env python3
"""Stand-in for `trtllm-build` (TensorRT-LLM cannot be installed here). Standard library only.

Parses its argv against tests/contracts/trtllm_build_flags.json for the version named by
STANDIN_TRTLLM_VERSION (latest | v0.16.0): an unknown flag or an illegal value exits 2 with an
argparse-style message. Applies the build-time rules of that contract it can check, requires
rank{N}.safetensors for every rank of the checkpoint's mapping, and writes an engine folder
(config.json + empty rank{N}.engine) shaped like the contract's. Test knobs: STANDIN_FAIL=1 exits 1
after printing an error; STANDIN_KILLED=1 SIGKILLs itself mid-build; STANDIN_SLEEP=S sleeps S seconds in a child process of its own first
(to test timeouts; STANDIN_PIDFILE receives both pids).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

CONTRACT = Path(__file__).resolve().parent / "contracts" / "trtllm_build_flags.json"
ENGINE_VERSION = {"latest": "1.2.0", "v0.16.0": "0.16.0"}
DTYPE_PLUGINS_OFF = "disable"
FP8_FMHA_ALGOS = {"FP8", "W4A8_AWQ", "NVFP4"}


def usage_error(message: str) -> None:
    print("usage: trtllm-build [-h] [--checkpoint_dir CHECKPOINT_DIR] ...", file=sys.stderr)
    print(f"trtllm-build: error: {message}", file=sys.stderr)
    sys.exit(2)


def fail(message: str) -> None:
    print(f"[TRT-LLM] [E] {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def parse(argv: list[str], flags: list[dict]) -> dict:
    """argparse-like: returns {dest: value} for every flag (defaults included, SUPPRESS ones absent)."""
    by_name = {}
    for f in flags:
        for name in [f["flag"], *f.get("aliases", [])]:
            by_name[name] = f
    ns = {f["dest"]: f["default"] for f in flags if not f.get("default_suppressed")}
    unknown, i = [], 0
    while i < len(argv):
        tok = argv[i]
        name, _, inline = tok.partition("=")
        f = by_name.get(name)
        if f is None:
            unknown.append(tok)
            i += 1
            continue
        if f.get("action") == "store_true":
            ns[f["dest"]] = True
            i += 1
            continue
        values = [inline] if inline else []
        i += 1
        while i < len(argv) and not argv[i].startswith("--") and (not values or f.get("nargs") == "+"):
            values.append(argv[i])
            i += 1
        if not values:
            usage_error(f"argument {f['flag']}: expected {'at least ' if f.get('nargs') else ''}one argument")
        converted = [convert(f, v) for v in values]
        ns[f["dest"]] = converted if f.get("nargs") == "+" else converted[0]
    if unknown:
        usage_error(f"unrecognized arguments: {' '.join(unknown)}")
    return ns


def convert(f: dict, value: str):
    if f["type"] == "int":
        try:
            out = int(value)
        except ValueError:
            usage_error(f"argument {f['flag']}: invalid int value: '{value}'")
    else:
        out = value
    choices = f.get("choices")
    if isinstance(choices, list) and value not in choices:
        usage_error(
            f"argument {f['flag']}: invalid choice: '{value}' (choose from {', '.join(map(repr, choices))})"
        )
    return out


def check_rules(ns: dict, version: str, ckpt: dict) -> None:
    """Build-time rules from the contract's build_time_behaviour that fail a build."""
    if ns.get("multiple_profiles") == "enable" and ns.get("opt_num_tokens") is not None:
        fail("multiple_profiles is enabled, opt_num_tokens must not be set")
    if (ns.get("gather_context_logits") or ns.get("gather_all_token_logits")) and ns.get(
        "max_draft_len", 0
    ) > 0:
        fail("gather_context_logits is not supported with speculative decoding (max_draft_len > 0)")
    if version == "latest" and ns.get("streamingllm") == "enable":
        fail("StreamingLLM is no longer supported")
    if ns.get("model_cls_file") and not ns.get("model_cls_name"):
        fail("--model_cls_name is required with --model_cls_file")
    if ns.get("gemm_swiglu_plugin") == "fp8" and ns.get("use_fused_mlp") != "enable":
        fail("gemm_swiglu_plugin needs --use_fused_mlp enable")
    for key in ("max_batch_size", "max_input_len", "max_num_tokens", "tokens_per_block", "workers"):
        if ns.get(key) is not None and ns[key] < 1:
            fail(f"{key} must be positive, got {ns[key]}")
    algo = (ckpt.get("quantization") or {}).get("quant_algo")
    if algo == "NVFP4" and version != "latest":
        fail("quant_algo NVFP4 is not supported by this TensorRT-LLM version")


def plugin_config(ns: dict, version: str, contract: dict, ckpt: dict, warn) -> dict:
    fields = contract["engine_output"]["plugin_config_fields"][version]
    out = {f["key"]: f["default"] for f in fields}
    dtype = ckpt.get("dtype", "float16")
    out["dtype"] = dtype
    dtype_plugins = {k for k, v in out.items() if isinstance(v, str) or v is None} - {"dtype"}
    for key in out:
        if key not in ns or ns[key] is None:
            continue
        value = ns[key]
        if value in ("enable", "disable") and key not in dtype_plugins:
            out[key] = value == "enable"
        elif key in dtype_plugins:
            out[key] = None if value == DTYPE_PLUGINS_OFF else (dtype if value == "auto" else value)
        else:
            out[key] = value
    algo = (ckpt.get("quantization") or {}).get("quant_algo")
    kv_algo = (ckpt.get("quantization") or {}).get("kv_cache_quant_algo")
    if algo == "NVFP4" and ns.get("gemm_plugin") != "disable":
        out["gemm_plugin"] = "nvfp4"
    if out.get("use_fp8_context_fmha") and algo not in FP8_FMHA_ALGOS:
        warn("use_fp8_context_fmha needs an FP8, W4A8_AWQ or NVFP4 checkpoint; disabling it")
        out["use_fp8_context_fmha"] = False
    if not out.get("context_fmha"):
        out["use_fp8_context_fmha"] = out["use_paged_context_fmha"] = False
    if out.get("use_paged_context_fmha"):  # builder.py rules (RuntimeError upstream)
        if kv_algo == "INT8":
            fail("Paged Context FMHA doesn't work with int8 kv cache currently.")
        if kv_algo == "FP8" and algo != "FP8":
            fail("FP8 Paged Context FMHA only works with fp8 quantization workflow currently.")
        if kv_algo == "FP8" and not out.get("use_fp8_context_fmha"):
            warn("FP8 Context FMHA is enabled by default to support FP8 Paged Context FMHA.")
            out["use_fp8_context_fmha"] = True
    if ns.get("fast_build"):
        out["manage_weights"] = True
    return out


def kv_cache_type(ns: dict) -> str:
    if "kv_cache_type" in ns:
        return ns["kv_cache_type"].upper()
    if "paged_kv_cache" in ns:
        return "PAGED" if ns["paged_kv_cache"] == "enable" else "CONTINUOUS"
    return "PAGED"


def build_config(ns: dict, version: str, contract: dict, ckpt: dict, plugins: dict, warn) -> dict:
    fields = contract["engine_output"]["build_config_fields"][version]
    out = {f["key"]: f["default"] for f in fields if f["key"] not in ("dry_run", "visualize_network")}
    for key in out:
        if ns.get(key) is not None and key != "plugin_config":
            out[key] = ns[key]
    out["use_strip_plan"] = bool(ns.get("strip_plan"))
    if out["max_seq_len"] is None:
        out["max_seq_len"] = int(ckpt.get("max_position_embeddings") or 2048)
    if out["max_input_len"] > out["max_seq_len"]:
        warn(f"max_input_len ({out['max_input_len']}) > max_seq_len ({out['max_seq_len']}); clipping it")
        out["max_input_len"] = out["max_seq_len"]
    out["kv_cache_type"] = kv_cache_type(ns)
    plugins["paged_kv_cache"] = out["kv_cache_type"] == "PAGED"
    out["plugin_config"] = plugins
    out["lora_config"] = {}
    if version == "v0.16.0":
        out["auto_parallel_config"] = {}
    return out


def main(argv: list[str]) -> int:
    version = os.environ.get("STANDIN_TRTLLM_VERSION", "latest")
    contract = json.loads(CONTRACT.read_text())
    if version not in contract["versions"]:
        usage_error(
            f"STANDIN_TRTLLM_VERSION must be one of {', '.join(contract['versions'])}, not {version!r}"
        )
    ns = parse(argv, contract["versions"][version]["flags"])
    warn = lambda msg: print(f"[TRT-LLM] [W] {msg}", flush=True)  # noqa: E731

    if os.environ.get("STANDIN_KILLED"):  # as if the kernel's OOM killer ended it mid-build
        print("[TRT-LLM] [I] Build phase: starting", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("STANDIN_SLEEP"):
        child = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({float(os.environ['STANDIN_SLEEP'])})"]
        )
        if os.environ.get("STANDIN_PIDFILE"):
            Path(os.environ["STANDIN_PIDFILE"]).write_text(f"{os.getpid()} {child.pid}\n")
        print("[TRT-LLM] [I] building (sleeping)", flush=True)
        child.wait()
    if os.environ.get("STANDIN_FAIL") == "1":
        print("[TRT-LLM] [I] Build phase: starting", flush=True)
        fail("stand-in failure requested by STANDIN_FAIL=1: [TensorRT] out of memory")

    if not ns.get("checkpoint_dir"):
        fail("--checkpoint_dir is required (LPX never builds from --model_config)")
    ckpt_dir = Path(ns["checkpoint_dir"])
    try:
        ckpt = json.loads((ckpt_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        fail(f"cannot read {ckpt_dir / 'config.json'}: {exc}")
    mapping = ckpt.get("mapping") or {}
    world = int(mapping.get("world_size") or int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1)))
    check_rules(ns, version, ckpt)
    for rank in range(world):
        if not (ckpt_dir / f"rank{rank}.safetensors").is_file():
            fail(f"{ckpt_dir / f'rank{rank}.safetensors'} is missing (mapping world_size {world})")

    print(f"[TRT-LLM] [I] Set dtype to {ckpt.get('dtype')}.", flush=True)
    plugins = plugin_config(ns, version, contract, ckpt, warn)
    build = build_config(ns, version, contract, ckpt, plugins, warn)
    out_dir = Path(ns["output_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        print(f"[TRT-LLM] [I] Build phase: rank {rank}/{world}", flush=True)
        (out_dir / f"rank{rank}.engine").write_bytes(b"")
    engine = {"version": ENGINE_VERSION[version], "pretrained_config": ckpt, "build_config": build}
    (out_dir / "config.json").write_text(json.dumps(engine, indent=2) + "\n")
    if ns.get("output_timing_cache"):
        Path(ns["output_timing_cache"]).parent.mkdir(parents=True, exist_ok=True)
        Path(ns["output_timing_cache"]).write_bytes(b"standin-timing-cache")
    print(
        f"[TRT-LLM] [I] Total time of building all engines: 00:00:00 ({world} rank(s) in {out_dir})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
