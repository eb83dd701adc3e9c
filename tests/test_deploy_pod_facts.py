"""The pods `lpx deploy k8s` writes, where a manifest that validates would still fail in the cluster (issue 42's
smaller defects): a count the manifests silently dropped, this machine's paths in a ConfigMap, vLLM's caches
in the 1 GiB LPX_HOME volume, and what --help tells a user to apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.config import load_config, parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import cluster, k8s, k8s_files
from pipeline.errors import UsageError


def config(tmp_path: Path, target: str = "torch", **deploy):
    checkpoint = tmp_path / "home" / "alice" / "models" / "tiny"
    data = demo_config_dict(str(checkpoint))
    data["build"].update({"target": target, "archs": ["sm90"]})
    data["deploy"] = deploy
    data["calibration"] = {"data": str(tmp_path / "home" / "alice" / "calib.txt")}
    data["serving"] = {"openai": {"access_log": str(tmp_path / "home" / "alice" / "access.log")}}
    return parse_config(data)


def test_deploy_replicas_is_refused_where_the_hpa_owns_the_count(tmp_path: Path) -> None:
    # On 2eeb7c6 replicas: 3 wrote a Deployment and an HPA of min 1, max 4, and said nothing.
    cfg = config(tmp_path, replicas=3)
    with pytest.raises(UsageError) as err:
        k8s_files(cfg, "fp8")
    assert "deploy.autoscaling.min_replicas: 3" in str(err.value)
    ok = config(tmp_path, replicas=3, autoscaling={"min_replicas": 3, "max_replicas": 6})
    hpa = cluster.autoscaler(ok, "fp8", "sm90")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 6)
    assert "replicas" not in k8s.deployment(ok, "fp8", "sm90")["spec"]


def test_the_sidecars_config_map_holds_no_path_of_this_machine(tmp_path: Path) -> None:
    # On 2eeb7c6 the ConfigMap carried model.checkpoint (and calibration data, the access log) as this
    # machine's absolute paths: nothing in the pod, and this machine's folders told to the cluster.
    cfg = config(tmp_path)
    text = k8s.config_map(cfg, "fp8")["data"]["lpx.yaml"]
    assert str(tmp_path) not in text
    deployed = yaml.safe_load(text)
    assert deployed["model"]["checkpoint"] == k8s.MODELS_MOUNT
    (tmp_path / "lpx.yaml").write_text(text)
    loaded = load_config(tmp_path / "lpx.yaml")  # the sidecar's `-c` still loads
    assert loaded.serving.openai.access_log is None and loaded.calibration.data is None


def test_vllm_caches_have_a_volume_of_their_own(tmp_path: Path) -> None:
    # On 2eeb7c6 VLLM_CACHE_ROOT and XDG_CACHE_HOME pointed into LPX_HOME's 1 GiB emptyDir (and Triton's
    # kernel cache at the read-only HOME): torch.compile's and the JIT's caches would get the pod evicted.
    cfg = config(tmp_path, "vllm", cache_size="24Gi")
    spec = k8s.deployment(cfg, "fp8", "sm90")["spec"]["template"]["spec"]
    triton = next(c for c in spec["containers"] if c["name"] == "triton")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["cache"]["emptyDir"]["sizeLimit"] == "24Gi"
    mounts = {m["mountPath"]: m["name"] for m in triton["volumeMounts"]}
    env = {e["name"]: e["value"] for e in triton["env"]}
    for name in ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        owner = max((p for p in mounts if env[name] == p or env[name].startswith(p + "/")), key=len)
        assert mounts[owner] == "cache", (name, env[name])
    torch_spec = k8s.deployment(config(tmp_path), "fp8", "sm90")["spec"]["template"]["spec"]
    assert "cache" not in {v["name"] for v in torch_spec["volumes"]}  # only the vllm target has them


def test_deploy_help_says_every_overlay_is_applied() -> None:
    out = CliRunner().invoke(cli, ["deploy", "k8s", "--help"]).output
    assert "Apply one overlay" not in out and "OUT/overlays/<arch>" in " ".join(out.split())
