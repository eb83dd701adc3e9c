"""Every pod `lpx deploy` writes starts: its LPX containers run as the kubelet would run them
(tests/pod_runner.py: the pod's network namespace, its own read-only root filesystem, its volumes mounted,
read-only where the manifest says so, its uid, no capabilities, its env, no GPU) until their readiness
probe passes, or, for the engine pod's Triton, until it needs the GPU; containers of upstream images
(NVIDIA's Triton TensorRT-LLM image, Dynamo's runtime) get their command line checked against the
program's known flags and the mounted layout. The LeaderWorkerSet's sshd and mpirun run for real in
tests/test_pods_mpi.py.

Real parts: the demo's repository (quantize -> torch build -> repo) packed by scripts/ci/package.sh, one
tritonserver per module (the torch pod's `lpx serve --repo /models`), the gateways in front of it. The
engine pods' gateway runs in the torch pod's network, where that Triton plays the engine Triton's part
(same model names); its repository is the packed one relabelled as built for sm90, which is what makes
`lpx gateway` choose by arch (issue 25, D1).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from pod_runner import Pod, PodFailure, entrypoint, pod_templates, resolve_command

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_k8s, images

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
KEYS = json.dumps({"keys": []})
SSH = {"host_key": "H\n", "authorized_keys": "A\n", "id_ed25519": "K\n", "known_hosts": "*\n"}


def lpx_images(cfg) -> dict[str, list[str]]:
    """LPX's images as the manifests name them (under deploy.registry) -> their Dockerfile's ENTRYPOINT."""
    d = cfg.deploy
    return {
        images.qualified(cfg, d.slim_image): entrypoint(ROOT / "Dockerfile.slim"),
        images.qualified(cfg, d.image): entrypoint(ROOT / "Dockerfile"),
        images.qualified(cfg, d.vllm_image): entrypoint(ROOT / "Dockerfile.vllm"),
    }


def lpx_pod(cfg, spec: dict, work: Path, models: Path, network=None, secrets: dict | None = None) -> Pod:
    """A pod of LPX's manifests as the tests start it: the generated ConfigMaps, the gateway keys' Secret
    (plus `secrets`), the models claim on `models`, and optionally another pod's network to join."""
    return Pod(
        spec,
        work,
        config_maps=GENERATED_CONFIG_MAPS,
        secrets={cfg.deploy.keys_secret: {"keys.json": KEYS}, **(secrets or {})},
        claims={cfg.deploy.repository.pvc or "lpx-models": models},
        network=network,
    )


@pytest.fixture(scope="module")
def packed(tmp_path_factory, tiny_checkpoint) -> dict[str, Path]:
    """The demo's repository packed by CI's script: the tarball, and unpacked twice: as built (torch,
    arch any) and relabelled as an sm90 engine's repository."""
    if os.geteuid() != 0:
        pytest.skip("the pod runner needs root (mount and network namespaces)")
    from pipeline.servers.tritonserver import find_tritonserver

    try:
        find_tritonserver()
    except Exception as exc:  # no tritonserver here: the module cannot run
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("pods")
    cfg = root / "lpx.yaml"
    cfg.write_text(yaml.safe_dump(demo_config_dict(str(tiny_checkpoint))))
    env = {**os.environ, "LPX_HOME": str(root / "ci-home"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    subprocess.run([str(BIN / "lpx"), "repo", "-c", str(cfg)], env=env, check=True, capture_output=True)
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ci" / "package.sh")],
        env={**env, "CONFIG": str(cfg), "IN": str(root / "in"), "OUT": str(root / "out")},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    tarball = root / "out" / "lpx-repos.tgz"
    torch_models = root / "torch-models"
    with tarfile.open(tarball) as tar:
        tar.extractall(torch_models, filter="data")
    engine_models = root / "engine-models"
    for manifest in (torch_models / "artifacts" / "repos").glob("*/*/any/*/manifest.json"):
        src = manifest.parent
        dst = engine_models / src.relative_to(torch_models).parent.parent / "sm90" / src.name
        shutil.copytree(src, dst)
        for m in (dst / "manifest.json", dst / "tensorrt_llm" / "1" / "engine" / "manifest.json"):
            if m.is_file():
                data = json.loads(m.read_text())
                data["arch"] = "sm90"
                m.write_text(json.dumps(data))
    assert list(engine_models.rglob("sm90/*/manifest.json"))
    return {"tarball": tarball, "torch": torch_models, "engine": engine_models}


def config(target: str, tp: int = 1, pp: int = 1, **deploy):
    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"].update({"target": target, "archs": ["sm90"], "tp_size": tp, "pp_size": pp})
    data["deploy"] = deploy
    return parse_config(data)


def workload(cfg, out: Path) -> dict:
    deploy_k8s(cfg, cfg.variants[0].name, out)
    GENERATED_CONFIG_MAPS.update(config_maps(out))
    (doc,) = [
        d
        for f in (out / "overlays" / "sm90").glob("*.yaml")
        for d in yaml.safe_load_all(f.read_text())
        if d["kind"] in ("Deployment", "LeaderWorkerSet")
    ]
    return doc


GENERATED_CONFIG_MAPS: dict[str, dict[str, str]] = {}  # every tree this module wrote: name -> data


def config_maps(out: Path) -> dict[str, dict[str, str]]:
    """The ConfigMaps `lpx deploy k8s` wrote under `out` (base and overlays): name -> {key: content}."""
    docs = [d for f in sorted(out.rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return {d["metadata"]["name"]: d["data"] for d in docs if d.get("kind") == "ConfigMap"}


def check_upstream_lpx(c: dict, volumes: dict) -> None:
    """An LPX container in an image that cannot run here (Triton TensorRT-LLM base): its args parse with
    the real CLI, and every path argument lies in a mounted volume."""
    import click

    from pipeline.cli import cli

    args = list(c["args"])
    ctx = click.Context(cli, info_name="lpx")
    command = cli.get_command(ctx, args[0])
    assert command is not None, f"lpx has no command {args[0]!r}"
    try:
        command.make_context(args[0], args[1:], parent=ctx)
    except click.UsageError as exc:
        raise PodFailure(f"{c['name']}: `lpx {' '.join(args)}`: {exc}") from None
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    for flag in ("--repo", "--keys"):
        if flag in args:
            path = args[args.index(flag) + 1]
            assert any(path == m or path.startswith(m + "/") for m in mounts), (c["name"], flag, path)


@pytest.fixture(scope="module")
def torch_pod(packed, tmp_path_factory):
    """The torch target's pod, its Triton started once (the engine pods' gateways use its network)."""
    cfg = config("torch")
    doc = workload(cfg, tmp_path_factory.mktemp("torch-tree"))
    ((_, spec),) = pod_templates(doc)
    pod = lpx_pod(cfg, spec, tmp_path_factory.mktemp("torch-pod"), packed["torch"])
    triton = spec["containers"][0]
    running = pod.start(triton, resolve_command(triton, lpx_images(cfg)))
    try:
        pod.wait_ready(triton, running, timeout=240)
        yield cfg, spec, pod
    finally:
        pod.cleanup()


def run_gateway(pod: Pod, spec: dict, images: dict) -> float:
    (gateway,) = [c for c in spec["containers"] if c["name"] == "gateway"]
    running = pod.start(gateway, resolve_command(gateway, images))
    try:
        return pod.wait_ready(gateway, running, timeout=120)
    finally:
        pod.running.remove(running)
        os.killpg(running.proc.pid, 15)
        running.proc.wait(timeout=60)


def test_torch_pod_becomes_ready(torch_pod) -> None:
    """Triton (`lpx serve --repo /models`, read-only) and the gateway of the torch target's Deployment pass
    their readiness probes; the liveness and startup paths are served too."""
    cfg, spec, pod = torch_pod
    triton = spec["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    from pod_runner import in_netns, probe_once

    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert in_netns(pod.net_pid, lambda p=probe: probe_once(triton[p], ports)), probe
    run_gateway(pod, spec, lpx_images(cfg))


@pytest.mark.parametrize(
    "case",
    [
        {"tp": 2},  # one node: a Deployment
        {"tp": 8, "pp": 2, "gpus_per_node": 8},  # a LeaderWorkerSet: the leader runs the gateway
    ],
    ids=["deployment", "lws-leader"],
)
def test_engine_pod_gateway_becomes_ready_without_a_gpu(torch_pod, packed, tmp_path, case) -> None:
    """The engine target's gateway sidecar (no GPU in its container) serves an sm90 repository and passes
    its readiness probe; the Triton container's command line parses with the real CLI."""
    _, _, shared = torch_pod
    tp, pp = case.get("tp", 1), case.get("pp", 1)
    cfg = config("engine", tp, pp, **{k: v for k, v in case.items() if k not in ("tp", "pp")})
    doc = workload(cfg, tmp_path / "tree")
    role, spec = pod_templates(doc)[0]
    # the shared Triton lives in the torch pod's network
    pod = lpx_pod(cfg, spec, tmp_path / "pod", packed["engine"], shared, {cfg.deploy.ssh_secret: SSH})
    try:
        check_upstream_lpx(spec["containers"][0], pod.sources)
        run_gateway(pod, spec, lpx_images(cfg))
    finally:
        pod.cleanup()


def test_engine_pod_triton_runs_until_it_needs_a_gpu(packed, tmp_path) -> None:
    """The engine pod's Triton container runs its real command line (`lpx serve --repo /models ...`) as the
    kubelet would - read-only root, uid 1000, no capabilities, /models read-only - and gets as far as a
    machine without a GPU can: it finds the sm90 repository in the mounted volume and stops at the GPU
    check with its one-line message, not earlier on a path, a permission or a read-only file."""
    cfg = config("engine", 2)
    ((_, spec),) = pod_templates(workload(cfg, tmp_path / "tree"))
    triton = spec["containers"][0]
    pod = lpx_pod(cfg, spec, tmp_path / "pod", packed["engine"])
    try:
        running = pod.start(triton, resolve_command(triton, lpx_images(cfg)))
        with pytest.raises(PodFailure, match=r"exited 1 before ready(.|\n)*No NVIDIA GPU found") as failed:
            pod.wait_ready(triton, running, timeout=120)
    finally:
        pod.stop()
    assert "(sm90)" in str(failed.value) and "Traceback" not in str(failed.value)
    assert not any(w in str(failed.value) for w in ("Read-only file system", "Permission denied"))


def test_vllm_pod_gateway_becomes_ready(torch_pod, packed, tmp_path) -> None:
    """The vllm target's pod (tp 2): its Triton container (LPX's vllm image, `lpx serve --repo /models`)
    parses with the real CLI and names only mounted paths; its gateway sidecar runs as the kubelet would
    and passes its readiness probe against the torch pod's Triton (same model names; a vllm repository is
    built for any arch, like the torch one). The Triton + vLLM container itself is not started here:
    tests/test_vllm_serving.py serves the vllm target on a real tritonserver through the same `lpx serve`
    path, and a second vLLM start would add 100-170 s to the suite."""
    _, _, shared = torch_pod
    cfg = config("vllm", tp=2)
    ((_, spec),) = pod_templates(workload(cfg, tmp_path / "tree"))
    assert spec["containers"][0]["image"] == images.qualified(cfg, cfg.deploy.vllm_image)
    pod = lpx_pod(cfg, spec, tmp_path / "pod", packed["torch"], shared)  # the torch pod's Triton, shared
    try:
        check_upstream_lpx(spec["containers"][0], pod.sources)
        run_gateway(pod, spec, lpx_images(cfg))
    finally:
        pod.cleanup()


def minimal_engine_repo(folder: Path, arch: str) -> Path:
    """Just what `lpx gateway --repo` reads to choose a repository: a complete repo manifest, ensemble/,
    the engine's build manifest (its arch)."""
    from pipeline.artifacts import SCHEMA

    repo = folder / "artifacts" / "repos" / "tiny-llama" / "fp8" / arch / "0123456789ab"
    (repo / "ensemble").mkdir(parents=True)
    (repo / "tensorrt_llm" / "1" / "engine").mkdir(parents=True)
    manifest = {"schema": SCHEMA, "key": repo.name, "complete": True, "stage": "repo", "created": 1.0}
    manifest.update({"model": "tiny-llama", "variant": "fp8", "arch": arch})
    (repo / "manifest.json").write_text(json.dumps(manifest))
    (repo / "tensorrt_llm" / "1" / "engine" / "manifest.json").write_text(json.dumps({"arch": arch}))
    return folder


def test_runner_fails_a_sidecar_that_looks_for_a_gpu(tmp_path) -> None:
    """The sidecar as written before issue 25 (no --arch) exits at once in a pod without a GPU: the
    runner reports it with the container's log, without needing a Triton."""
    if os.geteuid() != 0:
        pytest.skip("the pod runner needs root (mount and network namespaces)")
    cfg = config("engine", tp=2)
    doc = workload(cfg, tmp_path / "tree")
    ((_, spec),) = pod_templates(doc)
    (gateway,) = [c for c in spec["containers"] if c["name"] == "gateway"]
    i = gateway["args"].index("--arch")
    del gateway["args"][i : i + 2]  # the old manifest's command line
    pod = lpx_pod(cfg, spec, tmp_path / "pod", minimal_engine_repo(tmp_path / "models", "sm90"))
    try:
        running = pod.start(gateway, resolve_command(gateway, lpx_images(cfg)))
        with pytest.raises(PodFailure, match=r"exited 1 before ready(.|\n)*No NVIDIA GPU found"):
            pod.wait_ready(gateway, running, timeout=120)
    finally:
        pod.stop()


def test_lws_worker_sshd_setup_runs_as_the_pod_would(tmp_path) -> None:
    """The worker's sshd setup runs as uid 1000 with the Secret mounted read-only and a read-only LPX image
    around it (everything it writes is in LPX_HOME): the host key and authorized keys are 0600 copies, the
    config uses only sshd_config keywords (contract) and forwards the container's environment; the exec'd
    sshd command line uses only sshd's flags. The environment goes on one SetEnv line: sshd uses only the
    first (the earlier one-line-per-variable setup left remote ranks with HOME alone). tests/test_pods_mpi.py
    runs the real sshd and mpirun on it."""
    if os.geteuid() != 0:
        pytest.skip("the pod runner needs root (mount and network namespaces)")
    from pipeline.deploy import mpi

    contract = json.loads((ROOT / "tests" / "contracts" / "openssh_sshd.json").read_text())
    cfg = config("engine", 8, 2, gpus_per_node=8)
    doc = workload(cfg, tmp_path / "tree")
    (worker_spec,) = [spec for role, spec in pod_templates(doc) if role == "worker"]
    (rank,) = worker_spec["containers"]
    script = rank["command"][-1]
    setup, _, exec_line = script.rpartition("exec ")
    sshd = exec_line.split()
    assert sshd[0] == "/usr/sbin/sshd" and all(f in contract["flags"] for f in sshd if f.startswith("-"))
    secret = {"host_key": "HOSTKEY\n", "authorized_keys": "ssh-ed25519 AAAA lpx\n", "id_ed25519": "K\n"}
    pod = Pod(
        worker_spec,
        tmp_path / "pod",
        secrets={cfg.deploy.ssh_secret: {**secret, "known_hosts": "*\n"}},
        claims={"lpx-models": minimal_engine_repo(tmp_path / "models", "sm90")},
    )
    try:
        pod.run(rank, ["sh", "-c", setup], timeout=60)
    finally:
        pod.stop()
    state = pod.sources["lpx-home"] / "sshd"
    for name in ("host_key", "authorized_keys"):
        assert (state / name).read_text() == secret[name]
        assert (state / name).stat().st_mode & 0o777 == 0o600 and (state / name).stat().st_uid == 1000
    lines = (state / "sshd_config").read_text().splitlines()
    assert {ln.split()[0] for ln in lines} <= set(contract["config_keywords"]), lines
    assert f"Port {mpi.SSH_PORT}" in lines
    (setenv,) = [shlex.split(ln)[1:] for ln in lines if ln.startswith("SetEnv")]
    env = {item.split("=", 1)[0] for item in setenv}
    assert {"PATH", "LPX_HOME", "CUDA_VISIBLE_DEVICES"} <= env


@pytest.mark.parametrize("good", [True, False], ids=["checksum-ok", "checksum-wrong"])
def test_init_container_streams_the_tarball_into_its_volume(packed, tmp_path, good) -> None:
    """The fetch init container's script (curl | tee fifo | tar, sha256 of the same stream) runs as the pod
    would, against CI's real tarball served inside the pod's network: with the right checksum the models
    volume holds the unpacked repositories and no tarball copy; with a wrong one it exits non-zero and the
    volume holds nothing `lpx serve --repo` would pick up."""
    import hashlib

    digest = hashlib.sha256(packed["tarball"].read_bytes()).hexdigest()
    url = "http://127.0.0.1:8080/lpx-repos.tgz"
    size = f"{packed['tarball'].stat().st_size * 20 // 2**20 + 1}Mi"
    repo = {"url": url, "sha256": digest if good else "0" * 64, "size": size}
    cfg = config("engine", 2, repository=repo)
    ((_, spec),) = pod_templates(workload(cfg, tmp_path / "tree"))
    (init,) = spec["initContainers"]
    pod = Pod(
        spec,
        tmp_path / "pod",
        config_maps=GENERATED_CONFIG_MAPS,
        secrets={cfg.deploy.keys_secret: {"keys.json": KEYS}},
    )
    from pod_runner import file_server

    try:
        with file_server(pod.net_pid, packed["tarball"].parent, 8080):
            if good:
                pod.run(init, init["command"], timeout=120)
            else:
                with pytest.raises(PodFailure, match="has sha256 .* not 0000"):
                    pod.run(init, init["command"], timeout=120)
    finally:
        pod.stop()
    models = pod.sources["models"]
    found = sorted(p.relative_to(models) for p in models.rglob("manifest.json"))
    if good:
        assert found and not list(models.rglob("*.tgz")) and not (models / ".incoming").exists()
        assert sorted(p.relative_to(packed["torch"]) for p in packed["torch"].rglob("manifest.json")) == found
    else:
        assert found == [] and list(models.iterdir()) == []
