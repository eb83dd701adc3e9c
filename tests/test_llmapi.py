"""The `llmapi` build target's folder, checked against tests/contracts/trtllm_llmapi_options.json
(LLM-API option names and trtllm-serve flags read from TensorRT-LLM's llm_args.py / commands/serve.py;
the contract's `unconfirmed` list says what rests on a flagged entry). No ModelOpt or TensorRT-LLM needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.config import parse_config
from pipeline.errors import LpxError
from pipeline.stages.build.llmapi import serve_command, write_llmapi

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "trtllm_llmapi_options.json").read_text())
OPTIONS = CONTRACT["options"]
HF_FILES = ("config.json", "tokenizer.json", "model.safetensors")


def _cfg(kv="fp8", version="1.2", **build):
    b = {
        "target": "llmapi",
        "trtllm_version": version,
        "max_batch_size": 6,
        "max_input_len": 512,
        "max_seq_len": 1024,
        "max_num_tokens": 4096,
        "tp_size": 2,
        "pp_size": 1,
        **build,
    }
    cfg = parse_config(
        {
            "model": {"name": "tiny", "checkpoint": "/nonexistent"},
            "variants": [{"name": "v", "quantization": {"format": "fp8", "kv_cache": kv}}],
            "build": b,
        }
    )
    return cfg, cfg.variants[0]


def _quantized(tmp_path: Path, with_hf: bool = True) -> Path:
    ckpt = tmp_path / "quantized"
    (ckpt / "state").mkdir(parents=True)
    if with_hf:
        (ckpt / "hf").mkdir()
        for name in HF_FILES:
            (ckpt / "hf" / name).write_text(f"placeholder {name}\n")
        # the options are checked against the checkpoint's config (pipeline/stages/quantize/export_check.py)
        (ckpt / "hf" / "config.json").write_text(
            json.dumps(
                {
                    "num_attention_heads": 4,
                    "hidden_size": 64,
                    "vocab_size": 512,
                    "max_position_embeddings": 2048,
                }
            )
        )
    return ckpt


def _paths(obj: dict, prefix: str = "") -> list[str]:
    """Every key of a nested mapping as a dotted path, parents included."""
    out = []
    for k, v in obj.items():
        path = f"{prefix}.{k}" if prefix else k
        out.append(path)
        if isinstance(v, dict):
            out += _paths(v, path)
    return out


def test_options_use_only_contract_names_and_config_values(tmp_path):
    cfg, variant = _cfg(kv="fp8")
    out = tmp_path / "out"
    res = write_llmapi(cfg, variant, _quantized(tmp_path), out)
    opts = yaml.safe_load((out / "llm_api_options.yaml").read_text())
    assert opts == res["options"]
    unknown = [p for p in _paths(opts) if p not in OPTIONS]
    assert not unknown, f"not in the LLM-API contract: {unknown}"
    assert "backend" not in opts  # deprecated as an LLM-API field; passed as trtllm-serve --backend instead
    b = cfg.build
    assert (opts["tensor_parallel_size"], opts["pipeline_parallel_size"]) == (b.tp_size, b.pp_size)
    assert (opts["max_batch_size"], opts["max_num_tokens"]) == (b.max_batch_size, b.max_num_tokens)
    assert (opts["max_seq_len"], opts["max_input_len"]) == (b.max_seq_len, b.max_input_len)
    assert opts["enable_chunked_prefill"] is True and opts["trust_remote_code"] is False
    assert opts["kv_cache_config"] == {
        "free_gpu_memory_fraction": 0.9,
        "enable_block_reuse": True,
        "dtype": "fp8",
    }
    cg = opts["cuda_graph_config"]
    # the contract's rule: with both given, max_batch_size must equal max(batch_sizes)
    assert (
        cg["batch_sizes"] == [1, 2, 4, 6]
        and cg["max_batch_size"] == max(cg["batch_sizes"]) == b.max_batch_size
    )
    assert cg["enable_padding"] is True


def test_value_types_match_contract(tmp_path):
    cfg, variant = _cfg()
    opts = write_llmapi(cfg, variant, _quantized(tmp_path), tmp_path / "out")["options"]
    kinds = {"int": int, "Optional[int]": int, "NonNegativeInt": int, "bool": bool, "str": str}
    for path in _paths(opts):
        value = opts
        for part in path.split("."):
            value = value[part]
        typ = OPTIONS[path]["type"]
        if typ in kinds:
            assert type(value) is kinds[typ], f"{path}: {value!r} is not {typ}"
        elif typ.startswith("Optional[float]"):
            assert isinstance(value, float) and 0 <= value <= 1
        elif typ == "Optional[List[int]]":
            assert all(type(x) is int for x in value)


def test_no_fp8_kv_leaves_dtype_unset(tmp_path):
    cfg, variant = _cfg(kv="none")
    opts = write_llmapi(cfg, variant, _quantized(tmp_path), tmp_path / "out")["options"]
    assert (
        "dtype" not in opts["kv_cache_config"]
    )  # contract default 'auto' keeps the checkpoint's own KV setting


def test_model_yaml(tmp_path):
    cfg, variant = _cfg()
    out = tmp_path / "out"
    write_llmapi(cfg, variant, _quantized(tmp_path), out)
    model = yaml.safe_load((out / "model.yaml").read_text())
    assert model == {
        "backend": "pytorch",
        "model": "checkpoint",
        "options": "llm_api_options.yaml",
        "trtllm_version": "1.2",
        "format": "fp8",
        "kv_cache": "fp8",
    }
    assert model["backend"] in CONTRACT["serve_flags"]["--backend"]["choices"]
    assert (out / model["model"] / "config.json").is_file() and (out / model["options"]).is_file()


def test_checkpoint_files_are_hard_links(tmp_path):
    cfg, variant = _cfg()
    ckpt, out = _quantized(tmp_path), tmp_path / "out"
    res = write_llmapi(cfg, variant, ckpt, out)
    assert res["checkpoint_files"] == len(HF_FILES)
    for name in HF_FILES:
        assert (out / "checkpoint" / name).stat().st_ino == (ckpt / "hf" / name).stat().st_ino
    assert not (out / "checkpoint" / "state").exists()


def test_refuses_missing_hf(tmp_path):
    cfg, variant = _cfg(kv="none")
    with pytest.raises(LpxError, match=r"no HF checkpoint \(hf/config.json\).*re-run 'lpx quantize'"):
        write_llmapi(cfg, variant, _quantized(tmp_path, with_hf=False), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_refuses_int8_kv(tmp_path):
    # the config refuses it (facts/formats.py's refusal); write_llmapi refuses a config built in code the same way
    said = r"INT8 KV cache - set quantization.kv_cache: none or fp8, or build.target: engine"
    with pytest.raises(LpxError, match=said):
        _cfg(kv="int8")
    cfg, variant = _cfg()
    variant.quantization.__dict__["kv_cache"] = "int8"
    with pytest.raises(LpxError, match=said):
        write_llmapi(cfg, variant, _quantized(tmp_path, with_hf=False), tmp_path / "out")


def test_refuses_trtllm_016(tmp_path):
    # the config refuses it; write_llmapi refuses a config built without validation the same way
    with pytest.raises(LpxError, match=r"TensorRT-LLM >= 1.2.*trtllm_version: '1.3'.*build.target: engine"):
        _cfg(version="0.16")
    cfg, variant = _cfg()
    cfg.build.__dict__["trtllm_version"] = "0.16"
    with pytest.raises(LpxError, match=r"TensorRT-LLM >= 1.2.*trtllm_version: '1.3'.*build.target: engine"):
        write_llmapi(cfg, variant, _quantized(tmp_path), tmp_path / "out")


def test_serve_command_flags_in_contract(tmp_path):
    cfg, variant = _cfg()
    out = tmp_path / "out"
    write_llmapi(cfg, variant, _quantized(tmp_path), out)
    cmd = serve_command(out, "127.0.0.1", 8123)
    assert cmd[0] == "trtllm-serve" and cmd[1] == str(out / "checkpoint")
    flags = CONTRACT["serve_flags"]
    args = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert set(args) <= set(flags), set(args) - set(flags)
    assert args["--backend"] in flags["--backend"]["choices"]
    assert args["--extra_llm_api_options"] == str(out / "llm_api_options.yaml")
    assert (args["--host"], args["--port"], args["--tp_size"], args["--pp_size"]) == (
        "127.0.0.1",
        "8123",
        "2",
        "1",
    )
    for flag, value in args.items():
        if flags[flag]["type"] == "int":
            int(value)
