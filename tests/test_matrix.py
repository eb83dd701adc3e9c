"""`lpx matrix` cells and exclusions, and the CI example files (workflow, scripts, config)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli.tools import matrix as matrix_command
from pipeline.config import load_config
from pipeline.errors import LpxError
from pipeline.inspection.matrix import build_matrix, excluded_cells, write_cell_config

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = [ROOT / "scripts" / "ci" / f"{s}.sh" for s in ("quantize", "build", "package")]
WORKFLOW = ROOT / "examples" / "ci" / "build-engines.yml"


@pytest.fixture
def cfg_path(tmp_path: Path) -> Path:
    data = {
        "model": {"name": "m", "checkpoint": str(tmp_path / "missing")},
        "build": {"target": "engine", "archs": ["sm80", "sm90", "sm100"], "tp_size": 2},
        "variants": [
            {"name": "a", "quantization": {"format": "fp8"}},
            {"name": "b", "quantization": {"format": "nvfp4"}},
            {"name": "c", "quantization": {"format": "int4_awq"}},
        ],
    }
    path = tmp_path / "lpx.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cells_and_exclusions(cfg_path: Path) -> None:
    cfg = load_config(cfg_path)
    cells = {(c["variant"], c["arch"]) for c in build_matrix(cfg)}
    assert cells == {
        ("a", "sm90"),
        ("a", "sm100"),
        ("b", "sm100"),
        ("c", "sm80"),
        ("c", "sm90"),
        ("c", "sm100"),
    }
    cell = next(c for c in build_matrix(cfg) if c["name"] == "a-sm90")
    assert cell == {
        "name": "a-sm90",
        "variant": "a",
        "format": "fp8",
        "kv_cache": "none",
        "arch": "sm90",
        "sm": 90,
        "tp_size": 2,
        "pp_size": 1,
        "gpus": 2,
        "target": "engine",
        "trtllm_version": "1.2",
        "runner_label": "gpu-sm90",
    }
    reasons = {(e["variant"], e["arch"]): e["reason"] for e in excluded_cells(cfg)}
    assert set(reasons) == {("a", "sm80"), ("b", "sm80"), ("b", "sm90")}
    assert "sm89" in reasons[("a", "sm80")] and "sm100" in reasons[("b", "sm90")]


def test_kv_cache_and_trtllm_line_exclude(cfg_path: Path) -> None:
    cfg = load_config(cfg_path)
    cfg.variants[2].quantization.kv_cache = "fp8"
    cfg.build.trtllm_version = "0.16"
    reasons = {(e["variant"], e["arch"]): e["reason"] for e in excluded_cells(cfg)}
    assert "kv_cache 'fp8'" in reasons[("c", "sm80")]
    assert "TensorRT-LLM 0.16" in reasons[("b", "sm100")]


def test_json_format(cfg_path: Path) -> None:
    result = CliRunner().invoke(matrix_command, ["-c", str(cfg_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"include", "excluded"} and len(data["include"]) == 6 and len(data["excluded"]) == 3


def test_github_format(cfg_path: Path) -> None:
    result = CliRunner().invoke(matrix_command, ["-c", str(cfg_path), "--format", "github"])
    assert result.exit_code == 0, result.output
    assert result.output.count("\n") == 1 and result.output.endswith("\n")
    data = json.loads(result.output)
    assert list(data) == ["include"] and len(data["include"]) == 6
    for cell in data["include"]:
        assert all(isinstance(v, (str, int, float, bool)) or v is None for v in cell.values())


def test_config_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(matrix_command, [])
    assert isinstance(result.exception, LpxError) and "-c lpx.yaml" in result.exception.message


def test_cell_config_narrows_archs(cfg_path: Path, tmp_path: Path) -> None:
    out = write_cell_config(cfg_path, "a", None, tmp_path / "a.yaml")
    assert load_config(out).build.archs == ["sm90", "sm100"]
    assert load_config(write_cell_config(cfg_path, "c", "sm80", tmp_path / "c.yaml")).build.archs == ["sm80"]
    with pytest.raises(LpxError, match="needs sm100"):
        write_cell_config(cfg_path, "b", "sm90", tmp_path / "b.yaml")


def test_workflow_parses_and_uses_scripts() -> None:
    text = WORKFLOW.read_text()
    data = yaml.safe_load(text)
    assert set(data["jobs"]) == {"plan", "quantize", "build", "package", "deploy", "images"}
    assert "lpx deploy k8s" in text and "kubernetes-validate --strict" in text
    assert "needs.plan.outputs.matrix" in str(data["jobs"]["build"]["strategy"]["matrix"])
    for script in SCRIPTS:
        assert f"scripts/ci/{script.name}" in text


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_exist_executable_and_parse(script: Path) -> None:
    assert script.is_file() and os.access(script, os.X_OK)
    assert "set -euo pipefail" in script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_example_config_validates() -> None:
    cfg = load_config(ROOT / "examples" / "lpx.yaml")
    assert [v.quantization.format for v in cfg.variants] == ["fp8", "int4_awq"]
    # the GPU default: TensorRT-LLM 1.3's LLM API (trtllm-build engines stop at 1.2)
    assert (cfg.build.target, cfg.build.trtllm_version) == ("llmapi", "1.3")
    assert cfg.build.archs == ["sm90", "sm89"]
    assert len(build_matrix(cfg)) == 4
