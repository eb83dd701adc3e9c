"""Containers of upstream images in what `lpx deploy` writes, checked without the images (issue 25): each
Dynamo component's command line against the component's flags at the pinned Dynamo commit (and vLLM's
engine flags for Dynamo's vLLM worker), each path argument against the volumes mounted into it (a
ConfigMap key must exist), and the tritonserver command `lpx serve` composes in the engine pod against
tritonserver's own flags (tests/upstream_cli.py; the contracts name their sources). In-process, < 2 s."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from crd_schema import validate
from helpers_models import REAL_CONFIGS, TINY
from pod_runner import pod_templates
from upstream_cli import (
    check_dynamo_container,
    known_flags,
    unknown_flags,
    unknown_tritonserver_flags,
)

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_dynamo, dynamo
from pipeline.errors import NotFound

FAKE_KEY = "0123456789ab"


def config(target: str, tp: int = 1):
    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"].update({"target": target, "archs": ["sm90"], "tp_size": tp})
    return parse_config(data)


def fake_repo(home: Path, cfg) -> Path:
    """A complete repository as the repo stage leaves it for llmapi / vllm: the manifest, the checkpoint
    folder and (vllm) lpx_vllm.json as the vllm build writes it, from a real model config."""
    from pipeline.stages.build.vllm_target import build_file

    variant = cfg.variants[0]
    folder = home / "artifacts" / "repos" / cfg.model.name / variant.name / "any" / FAKE_KEY
    engine = folder / "tensorrt_llm" / "1" / "engine"
    (engine / "checkpoint").mkdir(parents=True)
    if cfg.build.target == "vllm":
        meta = build_file(cfg, variant, {**TINY, **REAL_CONFIGS["llama-3.1-8b"]})
        (engine / "lpx_vllm.json").write_text(json.dumps(meta))
    manifest = {"schema": 1, "key": FAKE_KEY, "complete": True, "stage": "repo", "created": 1.0}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def tree(tmp_path: Path, cfg, disagg: bool, api_version: str) -> tuple[list[dict], list[str]]:
    out = tmp_path / f"dyn-{cfg.build.target}-{api_version}-{disagg}"
    _, commands = deploy_dynamo(cfg, cfg.variants[0].name, out, disagg=disagg, api_version=api_version)
    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return docs, commands


@pytest.mark.parametrize("target", ["llmapi", "vllm"])
def test_dynamo_containers_take_their_flags_and_find_their_files(tmp_path, monkeypatch, target) -> None:
    """Every container of every component, aggregated and disaggregated, v1beta1 and v1alpha1: the graph
    validates against the pinned CRD, the worker is Dynamo's worker for the target, its flags exist, its checkpoint and engine file are in its mounts;
    the two local commands use flags the components take."""
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "home"))
    cfg = config(target)
    repo = fake_repo(tmp_path / "home", cfg)
    module = dynamo.BACKENDS[target]
    for api_version in ("v1beta1", "v1alpha1"):
        for disagg in (False, True):
            docs, commands = tree(tmp_path, cfg, disagg, api_version)
            config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
            (graph,) = [d for d in docs if d["kind"] == "DynamoGraphDeployment"]
            assert validate(graph) == []  # the pinned CRD (1.5.0 line); v1alpha1 also as 1.0.2 served it
            if api_version == "v1alpha1":
                assert validate(graph, "dynamographdeployment-v1.0.2.json") == []
            workers = 0
            for _, spec in pod_templates(graph):
                for c in spec["containers"]:
                    assert check_dynamo_container(c, spec, config_maps) == [], (api_version, disagg, c)
                    assert c["image"] == dynamo.IMAGES[target]
                    if c.get("command"):
                        workers += 1
                        assert c["command"] == ["python3", "-m", f"dynamo.{module}"]
                        path = c["args"][
                            c["args"].index("--model-path" if module == "trtllm" else "--model") + 1
                        ]
                        assert path.endswith(
                            str(repo.relative_to(tmp_path / "home") / "tensorrt_llm/1/engine/checkpoint")
                        )
            assert workers == (2 if disagg else 1)
            frontend, worker = (shlex.split(c) for c in commands)
            assert frontend[:3] == ["python3", "-m", "dynamo.frontend"]
            assert unknown_flags("dynamo.frontend", frontend[3:]) == []
            assert worker[:3] == ["python3", "-m", f"dynamo.{module}"]
            assert unknown_flags(f"dynamo.{module}", worker[3:]) == []


def test_dynamo_vllm_worker_carries_the_builds_engine_arguments(tmp_path, monkeypatch) -> None:
    """The vLLM worker's engine flags are lpx_vllm.json's engine_args and gpu_engine_args (not the CPU KV
    size), disaggregated workers add NIXL's KV transfer; the graph says backendFramework vllm."""
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "home"))
    cfg = config("vllm", tp=2)
    repo = fake_repo(tmp_path / "home", cfg)
    meta = json.loads((repo / "tensorrt_llm/1/engine/lpx_vllm.json").read_text())
    docs, _ = tree(tmp_path, cfg, True, "v1beta1")
    (graph,) = [d for d in docs if d["kind"] == "DynamoGraphDeployment"]
    assert graph["spec"]["backendFramework"] == "vllm" and not [d for d in docs if d["kind"] == "ConfigMap"]
    for component in graph["spec"]["components"][1:]:
        (main,) = component["podTemplate"]["spec"]["containers"]
        args = main["args"]
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert args[args.index("--tensor-parallel-size") + 1] == "2"
        assert args[args.index("--max-model-len") + 1] == str(meta["engine_args"]["max_model_len"])
        assert args[args.index("--quantization") + 1] == "modelopt"  # the demo variant is fp8
        assert args[args.index("--gpu-memory-utilization") + 1] == "0.9"
        assert "--kv-cache-memory-bytes" not in args and "--enable-prefix-caching" in args
        assert args[args.index("--disaggregation-mode") + 1] == component["type"]
        assert json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector"] == "NixlConnector"


def test_dynamo_vllm_needs_the_vllm_repository(tmp_path, monkeypatch) -> None:
    """The engine arguments are the build's: without a vllm repository (an llmapi one of the same variant
    does not count) nothing is written, even with --model-path, and the message names the fix."""
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "home"))
    fake_repo(tmp_path / "home", config("llmapi"))
    cfg = config("vllm")
    for model_path in (None, "/models/ckpt"):
        with pytest.raises(
            NotFound, match=r"No vllm repository .* run 'lpx repo .*needed even with --model-path"
        ):
            deploy_dynamo(cfg, "fp8", tmp_path / "out", model_path=model_path)
    assert not (tmp_path / "out").exists()


def test_the_checks_fail_on_what_they_guard() -> None:
    """A flag the component lacks (LPX's local command used --store-kv, which the pinned Dynamo does not
    take), a path outside the mounts and a missing ConfigMap key are each reported."""
    assert "--store-kv" not in known_flags("dynamo.frontend")
    assert unknown_flags("dynamo.trtllm", ["--model-path", "/m", "--store-kv", "file"]) == ["--store-kv"]
    assert unknown_flags("dynamo.vllm", ["--max-model-len", "8", "--max-modle-len", "8"]) == [
        "--max-modle-len"
    ]
    spec = {"volumes": [{"name": "engine-args", "configMap": {"name": "cm"}}]}
    c = {
        "name": "main",
        "command": ["python3", "-m", "dynamo.trtllm"],
        "args": ["--model-path", "/elsewhere/ckpt", "--extra-engine-args", "/etc/lpx/engine/worker.yaml"],
        "volumeMounts": [{"name": "engine-args", "mountPath": "/etc/lpx/engine"}],
    }
    problems = check_dynamo_container(c, spec, {"cm": {"prefill.yaml": ""}})
    assert any("/elsewhere/ckpt is in no volume" in p for p in problems)
    assert any("has no key 'worker.yaml'" in p for p in problems)


def test_engine_pods_tritonserver_takes_its_flags(monkeypatch) -> None:
    """The tritonserver command `lpx serve` composes in the engine pods (one rank; 16 ranks over a
    LeaderWorkerSet group of 2 nodes, mpirun's MPMD blocks) uses only flags tritonserver takes."""
    from pipeline.servers.ranks import mpi_command

    ports = {"http": 8000, "grpc": 8001, "metrics": 8002}
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "lpx-0.lpx.lpx.svc.cluster.local")
    monkeypatch.setenv("LWS_GROUP_SIZE", "2")
    for world in (1, 16):
        argv = mpi_command(
            Path("/opt/tritonserver/bin/tritonserver"),
            Path("/models/artifacts/repos/m/v/sm90/k"),
            world,
            "0.0.0.0",
            ports,
            "lpx1_",
            Path("/home/lpx/.lpx/logs"),
            mpirun=Path("/usr/local/mpi/bin/mpirun"),
        )
        assert sum(a.endswith("tritonserver") for a in argv) == world
        assert unknown_tritonserver_flags(argv) == [], world
    assert unknown_tritonserver_flags(["tritonserver", "--model-repository=/m", "--grpc-prt=1"]) == [
        "--grpc-prt"
    ]
