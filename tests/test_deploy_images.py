"""Images and the vllm target in `lpx deploy k8s` (issue 25 D13, issue 26): every image a manifest names
has a registry (upstream ones as published, LPX's under deploy.registry), each overlay lists its images
for kustomize to change, `--registry` and lpx.yaml set LPX's, a bad one is refused; the vllm target's pod
runs LPX's vllm image (vLLM's caches in the writable LPX_HOME) with the build's GPUs, and is refused
across nodes. In-process (CliRunner, direct calls), about 1 s."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_k8s, images, k8s
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
        assert any(env[name].startswith(m + "/") for m in mounts), (name, env[name])
    assert triton["args"][:3] == ["serve", "--repo", k8s.MODELS_MOUNT]
    with pytest.raises(UsageError, match="keep tp_size x pp_size <= deploy.gpus_per_node"):
        deploy_k8s(config("vllm", tp=8, gpus_per_node=4), "fp8", tmp_path / "lws")
    assert not (tmp_path / "lws").exists()
