"""The vllm target's pod with vLLM for real: its Triton container (`lpx serve --repo /models`, LPX's vllm
image) runs under the pod runner as the kubelet would run it (its network namespace, /models read-only,
uid 1000, no GPU, the manifest's env: vLLM's caches in the writable LPX_HOME), starts vLLM from the
checkout's .venv-vllm (the image's /opt/vllm), passes its startup, liveness and readiness probes and
generates; the gateway sidecar then becomes ready in front of it.

Opt-in (LPX_TEST_VLLM_POD=1, with .venv-vllm from `make vllm`): one vLLM start costs 120-170 s on 2
shared cores, and tests/test_vllm_serving.py already serves the vllm target through the same `lpx serve`
path in `make test`; this adds what only the pod adds (its mounts, uid, env). Measured 2026-12-04 on this
machine: ready after 123 s, 149 s in all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from pod_runner import Pod, entrypoint, in_netns, pod_templates, probe_once, resolve_command

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_k8s, images

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = [
    pytest.mark.triton,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.environ.get("LPX_TEST_VLLM_POD") != "1",
        reason="opt-in: LPX_TEST_VLLM_POD=1 (a vLLM start, 120-170 s; see the module docstring)",
    ),
    pytest.mark.skipif(
        not (ROOT / ".venv-vllm" / "bin" / "python").is_file(), reason="no .venv-vllm here - run 'make vllm'"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="the pod runner needs root (mount and network namespaces)"),
]


def test_vllm_pod_serves_with_vllm(tmp_path, tiny_checkpoint) -> None:
    data = demo_config_dict(str(tiny_checkpoint))
    data["variants"] = [{"name": "bf16", "quantization": {"format": "none", "kv_cache": "none"}}]
    data["build"].update({"target": "vllm", "archs": ["sm90"]})
    (tmp_path / "lpx.yaml").write_text(yaml.safe_dump(data))
    home = tmp_path / "home"  # laid out as lpx-repos.tgz unpacks: the models PVC
    env = {**os.environ, "LPX_HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}"}
    subprocess.run([str(BIN / "lpx"), "repo", "-c", str(tmp_path / "lpx.yaml")], env=env, check=True)
    cfg = parse_config(data)
    deploy_k8s(cfg, "bf16", tmp_path / "tree")
    docs = [d for f in sorted((tmp_path / "tree").rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d and d.get("kind") == "ConfigMap"}
    ((_, spec),) = pod_templates(next(d for d in docs if d and d.get("kind") == "Deployment"))
    triton, gateway = spec["containers"]
    lpx_images = {
        images.qualified(cfg, cfg.deploy.vllm_image): entrypoint(ROOT / "Dockerfile.vllm"),
        images.slim(cfg): entrypoint(ROOT / "Dockerfile.slim"),
    }
    pod = Pod(
        spec,
        tmp_path / "pod",
        config_maps=maps,
        secrets={cfg.deploy.keys_secret: {"keys.json": json.dumps({"keys": []})}},
        claims={"lpx-models": home},
    )
    try:
        pod.wait_ready(triton, pod.start(triton, resolve_command(triton, lpx_images)), timeout=600)
        ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert in_netns(pod.net_pid, lambda p=probe: probe_once(triton[p], ports)), probe

        def generate() -> dict:
            body = json.dumps({"text_input": "Hello", "max_tokens": 8}).encode()
            url = f"http://127.0.0.1:{ports['http']}/v2/models/ensemble/generate"
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as r:
                return json.loads(r.read())

        out = in_netns(pod.net_pid, generate)
        assert out["num_output_tokens"] == 8 and out["text_output"], out
        assert (pod.sources["cache"] / "vllm").is_dir()  # VLLM_CACHE_ROOT: the cache volume, not LPX_HOME's
        pod.wait_ready(gateway, pod.start(gateway, resolve_command(gateway, lpx_images)), timeout=120)
    finally:
        pod.cleanup()
