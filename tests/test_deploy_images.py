"""Images and the vllm target in `lpx deploy k8s` (issue 25 D13, issue 26): every image a manifest names
has a registry (upstream ones as published, LPX's under deploy.registry), each overlay lists its images
for kustomize to change, `--registry` and lpx.yaml set LPX's, a bad one is refused; the vllm target's pod
runs LPX's vllm image (vLLM's caches in the writable LPX_HOME) with the build's GPUs, and is refused
across nodes. In-process (CliRunner, direct calls), about 1 s."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import cli, main
from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_k8s, dynamo, images, k8s
from pipeline.errors import ConfigError, UsageError


def config(target: str = "torch", tp: int = 1, **deploy):
    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"].update({"target": target, "archs": ["sm90"], "tp_size": tp})
    data["deploy"] = deploy
    return parse_config(data)


def overlay(folder: Path) -> tuple[dict, list[dict]]:
    o = folder / "overlays" / "sm90"
    docs = [d for f in sorted(o.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    (kust,) = [d for d in docs if d.get("kind") == "Kustomization"]
    return kust, [d for d in docs if d.get("kind") != "Kustomization"]


@pytest.mark.parametrize(
    "case",
    [
        ("torch", {}),
        (
            "engine",
            {"tp": 2, "repository": {"url": "https://x.example/r.tgz", "sha256": "a" * 64, "size": "1Gi"}},
        ),
        ("vllm", {"tp": 2}),
    ],
    ids=["torch", "engine-fetch", "vllm"],
)
def test_every_image_names_a_registry_and_the_overlay_lists_it(tmp_path, case) -> None:
    target, opts = case
    cfg = config(target, opts.pop("tp", 1), **opts)
    deploy_k8s(cfg, cfg.variants[0].name, tmp_path / "k")
    kust, objects = overlay(tmp_path / "k")
    found = images.of(objects)
    assert found and all(images.has_registry(i) for i in found), found
    assert images.server(cfg) in found and images.slim(cfg) in found
    assert images.server(cfg).startswith("localhost:5000/")  # the documented default registry
    listed = {(e["name"], e.get("newTag")) for e in kust["images"]}
    assert listed == {images.split(i)[:2] for i in found}
    if "repository" in opts:
        assert "docker.io/curlimages/curl:8.11.1" in found


def test_registry_from_the_cli_and_the_config_and_refused_when_malformed(tmp_path) -> None:
    cfg_file = tmp_path / "lpx.yaml"
    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"].update({"archs": ["sm90"]})
    data["deploy"] = {"registry": "registry.example.com:5000/team", "image": "ghcr.io/me/lpx-trtllm:2.0"}
    cfg_file.write_text(yaml.safe_dump(data))
    runner = CliRunner()
    res = runner.invoke(cli, ["deploy", "k8s", "-c", str(cfg_file), "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "registry.example.com:5000/team/lpx-slim:0.1.0" in res.output
    _, objects = overlay(tmp_path / "a")
    assert images.of(objects) == ["registry.example.com:5000/team/lpx-slim:0.1.0"]  # torch: one image
    res = runner.invoke(
        cli, ["deploy", "k8s", "-c", str(cfg_file), "--registry", "ghcr.io/org", "--out", str(tmp_path / "b")]
    )
    assert res.exit_code == 0 and images.of(overlay(tmp_path / "b")[1]) == ["ghcr.io/org/lpx-slim:0.1.0"]
    cfg = parse_config({**data, "build": {**data["build"], "target": "engine"}})
    assert images.server(cfg) == "ghcr.io/me/lpx-trtllm:2.0"  # an image naming its registry stays as it is
    for bad in ("lpx", "Registry.Example.com", "https://ghcr.io/org"):
        res = runner.invoke(
            cli, ["deploy", "k8s", "-c", str(cfg_file), "--registry", bad, "--out", str(tmp_path / "c")]
        )
        assert res.exit_code == 2 and "is not a registry" in res.output and "Traceback" not in res.output, (
            res.output
        )
    assert not (tmp_path / "c").exists()
    with pytest.raises(ConfigError, match=r"deploy.registry: 'https://ghcr.io/org' is not a registry"):
        parse_config({**data, "deploy": {"registry": "https://ghcr.io/org"}})
    with pytest.raises(ConfigError, match=r"deploy.vllm_image: 'LPX VLLM' is not an image reference"):
        parse_config({**data, "deploy": {"vllm_image": "LPX VLLM"}})


def test_an_overlay_moves_an_image_with_kustomize(tmp_path) -> None:
    """kustomize's images: entry LPX writes is the one to edit: a changed newName/newTag reaches the pod."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    cfg = config("torch")
    deploy_k8s(cfg, cfg.variants[0].name, tmp_path / "k")
    path = tmp_path / "k" / "overlays" / "sm90" / "kustomization.yaml"
    kust = yaml.safe_load(path.read_text())
    kust["images"][0].update(newName="mirror.example.com/lpx-slim", newTag="9.9")
    path.write_text(yaml.safe_dump(kust))
    res = subprocess.run([kubectl, "kustomize", str(path.parent)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    (dep,) = [d for d in yaml.safe_load_all(res.stdout) if d["kind"] == "Deployment"]
    assert {c["image"] for c in dep["spec"]["template"]["spec"]["containers"]} == {
        "mirror.example.com/lpx-slim:9.9"
    }


def test_vllm_pod_runs_lpx_vllm_image_with_the_builds_gpus(tmp_path) -> None:
    cfg = config("vllm", tp=2)
    deploy_k8s(cfg, cfg.variants[0].name, tmp_path / "k")
    _, objects = overlay(tmp_path / "k")
    (dep,) = [d for d in objects if d["kind"] == "Deployment"]
    triton, gateway = dep["spec"]["template"]["spec"]["containers"]
    assert triton["image"] == "localhost:5000/lpx-vllm:0.1.0" and gateway["image"] == images.slim(cfg)
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = {e["name"]: e["value"] for e in triton["env"]}
    mounts = [m["mountPath"] for m in triton["volumeMounts"] if not m.get("readOnly")]
    for name in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):  # the root filesystem is read-only
        assert any(f"{env[name]}/".startswith(m + "/") for m in mounts), (name, env[name])
    assert triton["args"][:3] == ["serve", "--repo", k8s.MODELS_MOUNT]
    with pytest.raises(UsageError, match="keep tp_size x pp_size <= deploy.gpus_per_node"):
        deploy_k8s(config("vllm", tp=8, gpus_per_node=4), "fp8", tmp_path / "lws")
    assert not (tmp_path / "lws").exists()


@pytest.fixture
def lpx(monkeypatch, capsys):
    """`lpx ARGS` through the console entry point (its error handling: UsageError -> exit 2): (exit code,
    stdout + stderr with the lines joined)."""

    def run(args: list[str]) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["lpx", *args])
        code = 0
        try:
            main()
        except SystemExit as exited:
            code = exited.code or 0
        out = capsys.readouterr()
        assert "Traceback" not in out.out + out.err
        return code, " ".join((out.out + out.err).split())

    return run


def _write(tmp_path: Path, target: str, build: dict, deploy: dict) -> Path:
    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"].update({"target": target, "archs": ["sm90"], **build})
    data["deploy"] = deploy
    path = tmp_path / f"lpx-{len(list(tmp_path.glob('lpx-*')))}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_deploy_k8s_refuses_an_engine_the_deployed_image_cannot_load(tmp_path, lpx) -> None:
    """An engine built for TensorRT-LLM 0.16 in the image of the Dockerfile's default base (1.2.1) would not
    load: refused (exit 2) with the base to build on and the key to set; once both say 24.12 it deploys; a
    base LPX has no figures for deploys with a warning naming the line to check."""
    old = _write(tmp_path, "engine", {"trtllm_version": "0.16"}, {})
    code, said = lpx(["deploy", "k8s", "-c", str(old), "--out", str(tmp_path / "a")])
    assert code == 2 and "ships TensorRT-LLM 1.2.1" in said and "built for TensorRT-LLM 0.16" in said, said
    assert "--build-arg BASE_IMAGE=nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3" in said, said
    assert "deploy.image_base" in said and not (tmp_path / "a").exists()
    base = {"image_base": "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3"}
    fixed = _write(tmp_path, "engine", {"trtllm_version": "0.16"}, base)
    code, said = lpx(["deploy", "k8s", "-c", str(fixed), "--out", str(tmp_path / "b")])
    assert code == 0 and "warning" not in said, said
    custom = _write(tmp_path, "engine", {}, {"image_base": "registry.example.com/triton-trtllm:mine"})
    code, said = lpx(["deploy", "k8s", "-c", str(custom), "--out", str(tmp_path / "c")])
    assert code == 0 and "warning" in said and "ships TensorRT-LLM 1.2" in said, said


def test_the_default_engine_deploys_in_the_default_image_without_a_word(tmp_path, lpx) -> None:
    code, said = lpx(
        ["deploy", "k8s", "-c", str(_write(tmp_path, "engine", {}, {})), "--out", str(tmp_path / "k")]
    )
    assert code == 0 and "warning" not in said, said
    cfg = config("engine")
    assert cfg.build.trtllm_version == "1.2" and images.engine_line_refusal(cfg) == (None, None)
    with pytest.raises(ConfigError, match=r"deploy.image_base: 'Triton 26' is not an image reference"):
        config("engine", image_base="Triton 26")


def test_deploy_dynamo_refuses_llmapi_options_for_another_line_than_its_runtime(tmp_path, lpx) -> None:
    """Dynamo 1.6.1's tensorrtllm-runtime ships TensorRT-LLM 1.3.0rc29: llmapi options written for 1.2 are
    refused with the line to set; the default (1.3) is accepted."""
    cfg = config("llmapi")
    assert images.dynamo_line_refusal(cfg, dynamo.IMAGES["llmapi"]) == (None, None)
    pinned = _write(tmp_path, "llmapi", {"trtllm_version": "1.2"}, {})
    code, said = lpx(["deploy", "dynamo", "-c", str(pinned), "--out", str(tmp_path / "d")])
    assert (
        code == 2 and "ships TensorRT-LLM 1.3.0rc29" in said and "set build.trtllm_version: '1.3'" in said
    ), said
    assert not (tmp_path / "d").exists()
    refusal, warning = images.dynamo_line_refusal(cfg, "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:9.9.9")
    assert refusal is None and "make sure it ships TensorRT-LLM 1.3" in warning
