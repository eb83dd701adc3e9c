"""The pod runner itself (tests/pod_runner.py) does what the kubelet does with a container's
securityContext and volumes, so the pod tests built on it cannot pass where a cluster would fail: the root
filesystem read-only (writes only into volumes), no capability left with `drop: [ALL]` and uid 1000, the
interpreter readable as in an image without any capability, a memory emptyDir a tmpfs of its sizeLimit,
a disk emptyDir over its sizeLimit a failure (the kubelet evicts the pod). On the engine pod LPX writes."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from pod_runner import Pod, PodFailure, pod_templates

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_k8s

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the pod runner needs root (mount and network namespaces)"
)

REPORT = """set +e
grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status
for p in / /etc /usr/bin /models /home/lpx/.lpx /tmp /dev/shm; do
  if touch "$p/.w" 2>/dev/null; then echo "writable $p"; rm -f "$p/.w"; else echo "read-only $p"; fi
done
python -c 'import pipeline; print("python ok")'
"""


def engine_pod(tmp_path: Path) -> tuple[dict, dict]:
    import yaml

    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"].update({"target": "engine", "archs": ["sm90"], "tp_size": 2})
    cfg = parse_config(data)
    deploy_k8s(cfg, cfg.variants[0].name, tmp_path / "tree")
    docs = [d for f in (tmp_path / "tree").rglob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d]
    ((_, spec),) = pod_templates(next(d for d in docs if d["kind"] == "Deployment"))
    return spec, {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}


def run(spec: dict, maps: dict, tmp_path: Path, script: str) -> tuple[Pod, str]:
    (tmp_path / "models").mkdir(parents=True, exist_ok=True)
    pod = Pod(
        spec,
        tmp_path / "pod",
        config_maps=maps,
        secrets={"lpx-gateway-keys": {"keys.json": '{"keys": []}'}},
        claims={"lpx-models": tmp_path / "models"},
    )
    try:
        return pod, pod.run(spec["containers"][0], ["sh", "-c", script], timeout=60).tail()
    finally:
        pod.stop()


def test_read_only_root_no_capabilities_volumes_writable(tmp_path) -> None:
    spec, maps = engine_pod(tmp_path)
    _, out = run(spec, maps, tmp_path, REPORT)
    lines = set(out.splitlines())
    for cap in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert f"{cap}:\t0000000000000000" in lines, out
    assert "NoNewPrivs:\t1" in lines and "python ok" in lines, out
    assert {"read-only /", "read-only /etc", "read-only /usr/bin", "read-only /models"} <= lines, out
    assert {"writable /home/lpx/.lpx", "writable /tmp", "writable /dev/shm"} <= lines, out
    # the runner follows the manifest both ways: root with a writable root filesystem writes there (into
    # the container's own layer, not this machine's), and `drop: [ALL]` leaves even root no capability
    loose = copy.deepcopy(spec)
    loose["securityContext"]["runAsNonRoot"] = False
    loose["containers"][0]["securityContext"].update(
        readOnlyRootFilesystem=False, runAsNonRoot=False, runAsUser=0, runAsGroup=0
    )
    _, out = run(loose, maps, tmp_path / "loose", REPORT.replace('rm -f "$p/.w"', ":"))
    assert {"writable /", "writable /etc", "CapBnd:\t0000000000000000"} <= set(out.splitlines()), out
    assert not Path("/.w").exists() and not Path("/etc/.w").exists()


def test_emptydir_size_limits(tmp_path) -> None:
    """/dev/shm (medium Memory) is a tmpfs of its sizeLimit: a write past it fails in the container; the
    disk emptyDir LPX_HOME over its sizeLimit fails the pod, as the kubelet's eviction would."""
    spec, maps = engine_pod(tmp_path)
    for v in spec["volumes"]:
        if v["name"] in ("dshm", "lpx-home"):
            v["emptyDir"]["sizeLimit"] = "1Mi"
    _, out = run(spec, maps, tmp_path, "dd if=/dev/zero of=/dev/shm/x bs=64k count=32 2>&1; echo rc=$?")
    assert "No space left on device" in out and "rc=1" in out, out
    with pytest.raises(PodFailure, match=r"emptyDir lpx-home uses \d+ bytes, over its sizeLimit 1048576"):
        run(spec, maps, tmp_path / "disk", "dd if=/dev/zero of=/home/lpx/.lpx/x bs=64k count=32")
