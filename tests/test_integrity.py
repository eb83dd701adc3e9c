"""A broken checkpoint is refused before it is quantized, with a message naming the file or tensor and the
fix, a non-zero exit, no traceback and nothing under $LPX_HOME/artifacts that looks complete (LPX issue 23).
Before this, a checkpoint missing a layer's tensors, a config of 3 layers over 2 layers of weights and a
bert config over Llama weights all quantized, passed the quality gate (random against random) and built.

One tiny checkpoint per family (the published configs of Llama-3.1-8B, Qwen2.5-0.5B and Mistral-7B-v0.3 on
tiny seeded weights), written once; each broken copy hard-links the unchanged files and rewrites the one it
breaks (safetensors edited as bytes: header JSON + data). The CLI runs in-process (pipeline.cli.main, the
same function the `lpx` script calls, so exit code and printed message are the real ones); two cases also
run as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest
import yaml
from helpers_checkpoints import (
    SHARDS,
    WEIGHTS,
    derive,
    edit_config,
    edit_tensors,
    layer,
    pack_st,
    poke,
    read_st,
    rewrite,
    shard,
    tensors,
    write_tensors,
)
from helpers_models import write_tiny_model

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.demo import demo_config_dict
from pipeline.errors import LpxError
from pipeline.inspection.checkpoint import CheckpointInfo, inspect_checkpoint
from pipeline.stages.quantize.integrity import calibration_error, check_finite, check_tensors
from pipeline.stages.quantize.model_io import load_model, load_tokenizer

MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "mistral-7b-v0.3")
ROOT = Path(__file__).resolve().parents[1]
BF16 = {"nan": b"\xc0\x7f", "inf": b"\x80\x7f", "huge": b"\x7f\x7f"}  # little-endian bf16: NaN, +inf, 3.39e38


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    base = tmp_path_factory.mktemp("integrity")
    return {name: write_tiny_model(base / name, name) for name in MODELS}


# --- the broken checkpoints: each breaks a copy and returns what the message must say --------------------
def layer_tensors_missing(ckpt, name):
    edit_tensors(ckpt, lambda items: [items.pop(k) for k in layer(1, items, "mlp.")])
    return [
        "3 tensor(s) the model needs are not in model.safetensors",
        "model.layers.1.mlp.down_proj.weight",
        "random values",
        "re-download the checkpoint",
    ]


def layer_missing(ckpt, name):
    edit_tensors(ckpt, lambda items: [items.pop(k) for k in layer(1, items)])
    return [
        "config.json declares num_hidden_layers 2 but the weights (model.safetensors) hold layers 0..0",
        "missing: 1",
        "re-download the checkpoint",
    ]


def config_more_layers(ckpt, name):
    edit_config(ckpt, num_hidden_layers=3)
    return [
        "declares num_hidden_layers 3 but the weights (model.safetensors) hold layers 0..1",
        "set num_hidden_layers to 2",
    ]


def bert_config(ckpt, name):
    edit_config(ckpt, model_type="bert", architectures=["BertForMaskedLM"])
    family = "qwen2" if name.startswith("qwen") else "llama / mistral"
    return [
        "config.json describes model_type 'bert' (BertForMaskedLM)",
        f"are a {family} model's",
        "use the config.json that came with these weights",
    ]


def architecture_edited(ckpt, name):
    other = "MistralForCausalLM" if name.startswith("llama") else "LlamaForCausalLM"
    edit_config(ckpt, architectures=[other])
    return [f"architectures ['{other}']", "one of the two was edited"]


def unexpected_tensor(ckpt, name):
    def add(items):
        items["model.layers.0.self_attn.extra_proj.weight"] = items["model.layers.0.self_attn.q_proj.weight"]

    edit_tensors(ckpt, add)
    return [
        "1 tensor(s) in model.safetensors are not part of the model",
        "model.layers.0.self_attn.extra_proj.weight",
        "use the config.json that came with these weights",
    ]


def shape_mismatch(ckpt, name):
    def reshape(items):
        meta, blob = items["model.layers.0.mlp.up_proj.weight"]
        rows, cols = meta["shape"]
        items["model.layers.0.mlp.up_proj.weight"] = ({**meta, "shape": [rows // 2, cols * 2]}, blob)

    edit_tensors(ckpt, reshape)
    return [
        "another shape than the model",
        "model.layers.0.mlp.up_proj.weight [64, 128]",
        "(model: [128, 64])",
    ]


def lm_head_missing(ckpt, name):
    if json.loads((ckpt / "config.json").read_text()).get("tie_word_embeddings"):
        edit_config(ckpt, tie_word_embeddings=False)  # a tied model's config un-tied: lm_head absent
    else:
        edit_tensors(ckpt, lambda items: items.pop("lm_head.weight"))
    return ["lm_head.weight", "set tie_word_embeddings: true"]


def shard_missing(ckpt, name):
    shard(ckpt)
    (ckpt / SHARDS[1]).unlink()
    return [
        "model.safetensors.index.json names 1 shard(s) that are not in",
        SHARDS[1],
        "download the missing shard",
    ]


def shard_mismapped(ckpt, name):
    def move(weight_map):
        weight_map["model.norm.weight"] = (
            SHARDS[0] if weight_map["model.norm.weight"] == SHARDS[1] else SHARDS[1]
        )

    shard(ckpt, mapping=move)
    return [
        "maps 1 tensor(s) to a shard that does not hold them",
        "model.norm.weight",
        "re-download the index",
    ]


def shard_tensor_absent(ckpt, name):
    shard(ckpt, drop={"model.norm.weight"})
    return ["maps 1 tensor(s) that no shard holds: model.norm.weight", "re-download the checkpoint"]


def truncated(ckpt, name):
    raw = (ckpt / WEIGHTS).read_bytes()
    rewrite(ckpt / WEIGHTS, raw[:-1000])
    return [f"{ckpt / WEIGHTS} is truncated", "(1000 missing)", "re-download the file"]


def header_garbage(ckpt, name):
    raw = (ckpt / WEIGHTS).read_bytes()
    rewrite(ckpt / WEIGHTS, raw[:8] + b"\x93garbage{" * 8 + raw[8 + 72 :])
    return [f"{ckpt / WEIGHTS} is not a readable safetensors file", "re-download it"]


def offsets_inconsistent(ckpt, name):
    header, data = read_st(ckpt / WEIGHTS)
    header["model.norm.weight"]["shape"] = [header["model.norm.weight"]["shape"][0] * 2]
    rewrite(ckpt / WEIGHTS, pack_st(header, data))
    return [
        f"{ckpt / WEIGHTS} has a damaged safetensors header",
        "model.norm.weight: 128 bytes for BF16 [128]",
        "re-download the file",
    ]


def tokenizer_missing(ckpt, name):
    (ckpt / "tokenizer.json").unlink()
    return [f"{ckpt} has no tokenizer (tokenizer.json / tokenizer.model / vocab.json)", "model.tokenizer"]


def tokenizer_json_corrupt(ckpt, name):
    rewrite(ckpt / "tokenizer.json", (ckpt / "tokenizer.json").read_text()[:500])
    return [f"{ckpt / 'tokenizer.json'} is not valid JSON", "re-download it"]


def tokenizer_config_corrupt(ckpt, name):
    rewrite(ckpt / "tokenizer_config.json", "{'tokenizer_class': 'PreTrainedTokenizerFast',")
    return [f"{ckpt / 'tokenizer_config.json'} is not valid JSON", "re-download it"]


def tokenizer_json_not_a_tokenizer(ckpt, name):
    rewrite(ckpt / "tokenizer.json", json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": 7}}))
    return [f"cannot load the tokenizer in {ckpt}", "re-download the tokenizer files"]


def config_not_object(ckpt, name):
    rewrite(ckpt / "config.json", json.dumps([json.loads((ckpt / "config.json").read_text())]))
    return [f"{ckpt / 'config.json'} holds a list, not a JSON object", "re-download it"]


def config_string_layers(ckpt, name):
    edit_config(ckpt, num_hidden_layers="2")
    return [
        'num_hidden_layers is "2" (a string), must be a positive integer - write it as 2 (no quotes)',
        f"{ckpt / 'config.json'} has fields of the wrong type",
    ]


def nan_weight(ckpt, name):
    edit_tensors(ckpt, lambda items: poke(items, "model.layers.1.mlp.up_proj.weight", BF16["nan"]))
    return [
        "non-finite weights in 1 tensor(s): model.layers.1.mlp.up_proj.weight (1 of 8192 values NaN / inf)",
        "re-download it",
    ]


def inf_weight(ckpt, name):
    edit_tensors(ckpt, lambda items: poke(items, "model.embed_tokens.weight", BF16["inf"]))
    return ["non-finite weights in 1 tensor(s): model.embed_tokens.weight (1 of", "re-download it"]


def overflowing_weights(ckpt, name):
    """Finite weights (3.4e38, bf16's largest) whose activations overflow: ModelOpt's amax assertion."""
    edit_tensors(ckpt, lambda items: poke(items, "model.layers.0.mlp.up_proj.weight", BF16["huge"], True))
    return ["ModelOpt met", "in a calibration range (amax)", "damaged or mis-converted checkpoint"]


# refused by the checkpoint inspection every stage shares, before any stage runs (metadata only)
BEFORE_ANY_STAGE = [
    layer_missing, config_more_layers, shard_missing, shard_mismapped, shard_tensor_absent, truncated,
    header_garbage, offsets_inconsistent, config_not_object, config_string_layers,
]  # fmt: skip
# refused by the quantize stage before it loads anything (tokenizer files; headers against the meta model)
BEFORE_LOADING = [
    layer_tensors_missing, bert_config, architecture_edited, unexpected_tensor, shape_mismatch,
    lm_head_missing, tokenizer_missing, tokenizer_json_corrupt, tokenizer_config_corrupt,
]  # fmt: skip
# found once the tokenizer or the weights are loaded, or while calibrating
AFTER_LOADING = [tokenizer_json_not_a_tokenizer, nan_weight, inf_weight, overflowing_weights]


# --- driving the CLI ------------------------------------------------------------------------------------
def lpx_yaml(folder: Path, ckpt: Path) -> Path:
    data = demo_config_dict(str(ckpt))
    data["calibration"] = {"samples": 4, "seq_len": 16, "batch_size": 4}
    path = folder / "lpx.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def lpx(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """`lpx ARGS` in this process through pipeline.cli.main: (exit code, everything it printed)."""
    monkeypatch.setattr(sys, "argv", ["lpx", *args])
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")  # what main() sets, scoped to this test
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main()
    out = capsys.readouterr()
    return ended.value.code, out.out + out.err


def assert_nothing_complete(home: Path) -> None:
    artifacts = home / "artifacts"
    assert not list(artifacts.rglob("manifest.json")), "a refused checkpoint left an artifact"
    assert not [p for p in artifacts.rglob(".tmp-*") if p.is_dir()], "a staging folder was left behind"


def assert_refused(code: int, out: str, expected: list[str]) -> None:
    assert code != 0, out
    assert "Traceback" not in out and "error: unexpected" not in out, out
    assert out.startswith("error: ") or "\nerror: " in out, out
    for text in expected:
        assert text in out, f"{text!r} not in:\n{out}"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    "breakage", BEFORE_ANY_STAGE + BEFORE_LOADING + AFTER_LOADING, ids=lambda f: f.__name__
)
def test_a_broken_checkpoint_is_refused(
    originals, tmp_path, isolated_home, monkeypatch, capsys, name, breakage
):
    """`lpx quantize` on the broken copy: a non-zero exit, the message naming the file or tensor and the fix,
    no traceback; a failed quantize stage removes its staging folder and commits nothing."""
    ckpt = derive(originals[name], tmp_path / name)
    expected = breakage(ckpt, name)
    code, out = lpx(monkeypatch, capsys, "quantize", "-c", str(lpx_yaml(tmp_path, ckpt)))
    assert_refused(code, out, expected)
    assert_nothing_complete(isolated_home)
    if breakage in BEFORE_ANY_STAGE:
        assert "running" not in out, "refused before any stage runs"
    else:
        assert "quantize  fp8" in out and "running" in out, "refused by the quantize stage"


def test_two_cases_end_to_end_in_a_subprocess(originals, tmp_path, isolated_home):
    """The real `lpx` process: exit code 1, one error line, no traceback, nothing complete under artifacts -
    a truncated file (`lpx quantize`) and a bert config over Qwen2 weights (`lpx run`, through the
    meta-device model). Side by side: most of their wall time is importing torch, not CPU."""
    runs = []
    for command, name, breakage in (
        ("quantize", "llama-3.1-8b", truncated),
        ("run", "qwen2.5-0.5b", bert_config),
    ):
        ckpt = derive(originals[name], tmp_path / breakage.__name__ / name)
        expected = breakage(ckpt, name)
        argv = [sys.executable, "-m", "pipeline", command, "-c", str(lpx_yaml(ckpt.parent, ckpt))]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        runs.append((subprocess.Popen(argv, stdout=PIPE, stderr=PIPE, text=True, env=env), expected))
    for proc, expected in runs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 1, stdout + stderr
        assert "\nerror: model.checkpoint: " in f"\n{stderr}", stderr
        assert_refused(proc.returncode, stdout + stderr, expected)
    assert_nothing_complete(isolated_home)


@pytest.mark.parametrize("name", MODELS)
def test_an_intact_checkpoint_passes_every_check(originals, tmp_path, name):
    """The positive control: the untouched checkpoint of each family passes the header check, the load-time
    check and the finite scan, so the checks above do not refuse everything."""
    info = inspect_checkpoint(originals[name])
    header = tensors(originals[name] / WEIGHTS)
    assert check_tensors(info, False) == f"{len(header)} tensors match the model config.json describes"
    cfg = load_config(lpx_yaml(tmp_path, originals[name]))
    model = load_model(cfg, info)
    assert check_finite(model, info.path) == len(header), "every tensor of the checkpoint scanned, once"
    assert load_tokenizer(cfg)("hello world")["input_ids"]


def test_a_full_quantize_of_an_intact_checkpoint_still_commits(
    originals, tmp_path, isolated_home, monkeypatch, capsys
):
    ckpt = derive(originals["qwen2.5-0.5b"], tmp_path / "ok")
    monkeypatch.setattr(sys, "argv", ["lpx", "quantize", "-c", str(lpx_yaml(tmp_path, ckpt))])
    main()  # returns (no SystemExit) on success
    (manifest,) = (isolated_home / "artifacts").rglob("manifest.json")
    assert json.loads(manifest.read_text())["results"]["timings"]["finite_scan_s"] >= 0


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (layer_tensors_missing, "3 missing (filled with random values): model.layers.1.mlp.down_proj.weight"),
        (
            unexpected_tensor,
            "1 in the checkpoint but not in the model: model.layers.0.self_attn.extra_proj.weight",
        ),
        (shape_mismatch, "1 of another shape than the model's: model.layers.0.mlp.up_proj.weight"),
    ],
    ids=["missing", "unexpected", "mismatched"],
)
def test_the_load_time_check_refuses_on_its_own(originals, tmp_path, breakage, expected):
    """Belt and braces: with the header check bypassed, from_pretrained's own loading info refuses."""
    ckpt = derive(originals["llama-3.1-8b"], tmp_path / "ckpt")
    breakage(ckpt, "llama-3.1-8b")
    info = CheckpointInfo(ckpt, json.loads((ckpt / "config.json").read_text()), [ckpt / WEIGHTS], False)
    with pytest.raises(LpxError) as err:
        load_model(load_config(lpx_yaml(tmp_path, ckpt)), info)
    assert expected in err.value.message and "re-download the checkpoint" in err.value.message


def test_only_modelopts_amax_assertion_becomes_a_message():
    nan = calibration_error(
        AssertionError("detected nan values in amax. nan in original tensor: False"), "a", "bfloat16"
    )
    assert "variant 'a': ModelOpt met NaN" in nan.message and "overflow bfloat16" in nan.message
    assert "try calibration.dtype: float32" in nan.message
    wide = calibration_error(AssertionError("detected inf values in amax"), "a", "float32")
    assert "overflow float32" in wide.message and "try calibration.dtype" not in wide.message
    assert calibration_error(AssertionError("detected negative values after abs"), "a", "bfloat16") is None
    assert calibration_error(RuntimeError("detected nan values in amax"), "a", "bfloat16") is None


def test_consolidated_weights_beside_the_hf_weights_are_not_read(originals, tmp_path):
    """Mistral's repositories ship consolidated.safetensors (another naming, for other tools) beside the HF
    weights: transformers loads model.safetensors alone, and so does the check (no false refusal)."""
    ckpt = derive(originals["mistral-7b-v0.3"], tmp_path / "mistral")
    items = tensors(ckpt / WEIGHTS)
    write_tensors(
        ckpt / "consolidated.safetensors",
        {k.replace("self_attn.q_proj", "attention.wq"): v for k, v in items.items()},
    )
    info = inspect_checkpoint(ckpt)
    assert [f.name for f in info.weights] == [WEIGHTS]
    assert check_tensors(info, False) == f"{len(items)} tensors match the model config.json describes"
