"""`lpx deploy`: every generated manifest validates offline, and the images lint clean.

No cluster, registry or container daemon exists here, so nothing is applied or built. Core objects go
through kubernetes-validate --strict for two Kubernetes minor versions; custom resources (LeaderWorkerSet,
ServiceMonitor, PrometheusRule, DynamoGraphDeployment) through tests/crd_schema.py against the CRD
schemas pinned in tests/contracts/crds/ (README there: source, commit, date); checkov scans the
manifests and both Dockerfiles, hadolint the Dockerfiles. The linters live in .venv-lint (`make
lint-tools`, which `make test` runs first): checkov's pins do not fit LPX's own environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from crd_schema import FILES, validate

from pipeline.config import parse_config
from pipeline.demo import demo_config_dict
from pipeline.deploy import deploy_dynamo, deploy_k8s, k8s
from pipeline.errors import LpxError
from pipeline.servers.ranks import mpi_hosts

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSIONS = ("1.30.0", "1.34.0")
CONTRACT = json.loads((ROOT / "tests" / "contracts" / "trtllm_llmapi_options.json").read_text())["options"]


def tool(name: str) -> str:
    found = ROOT / ".venv-lint" / "bin" / name
    if found.exists():
        return str(found)
    other = shutil.which(name)
    if other is None:
        pytest.skip(f"{name} not installed - run 'make lint-tools' (make test does)")
    return other


def config(target: str = "torch", archs=("sm90", "sm89", "sm100"), tp: int = 1, pp: int = 1, **deploy):
    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"].update({"target": target, "archs": list(archs), "tp_size": tp, "pp_size": pp})
    data["deploy"] = deploy
    return parse_config(data)


def documents(folder: Path) -> list[tuple[Path, dict]]:
    out = []
    for f in sorted(folder.rglob("*.yaml")):
        out += [(f, d) for d in yaml.safe_load_all(f.read_text()) if d]
    return out


# (name, config) users deploy: the demo's torch target; an engine on one node with tp 2 fetched from CI's
# tarball; an engine whose tp x pp spans nodes (LeaderWorkerSet).
CASES = {
    "torch": lambda: config(),
    "engine-tp2-url": lambda: config(
        "engine",
        archs=("sm90",),
        tp=2,
        repository={
            "url": "https://objects.example.com/ci/lpx-repos.tgz",
            "sha256": "ab" * 32,
            "size": "3Gi",
        },
    ),
    "engine-tp8-pp2-lws": lambda: config("engine", archs=("sm90",), tp=8, pp=2, gpus_per_node=8),
    "vllm-tp2": lambda: config("vllm", archs=("sm90", "sm100"), tp=2),
}


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    out = {}
    for name, make in CASES.items():
        cfg = make()
        folder = tmp_path_factory.mktemp(name) / "k8s"
        deploy_k8s(cfg, cfg.variants[0].name, folder)
        out[name] = (cfg, folder)
    return out


@pytest.fixture(scope="module")
def dynamo_tree(tmp_path_factory) -> Path:
    """Both Dynamo trees, disaggregated, under one folder: llmapi (TensorRT-LLM worker) and vllm (vLLM
    worker, whose engine flags come from a repository's lpx_vllm.json)."""
    from test_pods_upstream import fake_repo

    root = tmp_path_factory.mktemp("dynamo")
    cfg = config("llmapi", archs=("sm90",))
    deploy_dynamo(cfg, cfg.variants[0].name, root / "dyn", disagg=True, model_path="/models/ckpt")
    cfg = config("vllm", archs=("sm90",))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LPX_HOME", str(root / "home"))
        fake_repo(root / "home", cfg)
        deploy_dynamo(cfg, cfg.variants[0].name, root / "dyn-vllm", disagg=True)
    return root


def test_core_objects_validate_strictly_on_two_kubernetes_versions(trees, dynamo_tree) -> None:
    validator = tool("kubernetes-validate")
    core = []
    for folder in [f for _, f in trees.values()] + [dynamo_tree]:
        for f, doc in documents(folder):
            if "apiVersion" in doc and doc["kind"] not in FILES and doc["kind"] != "Kustomization":
                core.append(str(f))
    assert len(core) >= 20
    for version in K8S_VERSIONS:
        res = subprocess.run(
            [validator, "--strict", "-k", version, *sorted(set(core))],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_custom_resources_validate_against_the_pinned_crds(trees) -> None:
    kinds = set()
    for _, folder in trees.values():
        for f, doc in documents(folder):
            if doc["kind"] in FILES:
                kinds.add(doc["kind"])
                assert validate(doc) == [], (f, validate(doc))
    assert kinds == {"LeaderWorkerSet", "ServiceMonitor", "PrometheusRule"}


def checkov(*args: str) -> subprocess.CompletedProcess:
    """checkov offline (no policy download), quiet, compact."""
    cmd = [tool("checkov"), *args, "--skip-download", "--quiet", "--compact"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def embedded_pods(doc: dict) -> list[dict]:
    """The pod templates inside LeaderWorkerSet and DynamoGraphDeployment objects, as Deployments (checkov
    scans those; it does not look inside custom resources), carrying the owner's skip annotations."""
    from pod_runner import pod_templates

    if doc.get("kind") not in ("LeaderWorkerSet", "DynamoGraphDeployment"):
        return []
    out = []
    t = doc["spec"].get("leaderWorkerTemplate", {})
    pod_labels = {
        "leader": t.get("leaderTemplate", {}).get("metadata", {}).get("labels", {}),
        "worker": t.get("workerTemplate", {}).get("metadata", {}).get("labels", {}),
    }
    for role, spec in pod_templates(doc):
        name = k8s.dns_name(doc["metadata"]["name"], role)
        labels = {"pod": name, **pod_labels.get(role, {})}
        if doc["kind"] == "LeaderWorkerSet":
            labels["leaderworkerset.sigs.k8s.io/name"] = doc["metadata"]["name"]
        meta = {
            "name": name,
            "namespace": doc["metadata"]["namespace"],
            "annotations": doc["metadata"].get("annotations", {}),
        }
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {
                    "selector": {"matchLabels": {"pod": name}},
                    "template": {"metadata": {"labels": labels}, "spec": spec},
                },
            }
        )
    return out


def test_checkov_passes_with_every_skip_justified(trees, dynamo_tree, tmp_path) -> None:
    """One checkov run over every tree and every pod template embedded in a custom resource (~10 s)."""
    parent = {f.parent.parent for _, f in trees.values()}
    assert len(parent) == 1
    extracted = []
    for folder in [f for _, f in trees.values()] + [dynamo_tree]:
        for _, doc in documents(folder):
            extracted += embedded_pods(doc)
    assert len(extracted) >= 8  # LWS leader + worker, two Dynamo graphs' frontend + prefill + decode
    (tmp_path / "embedded.yaml").write_text(yaml.safe_dump_all(extracted))
    res = checkov("-d", str(parent.pop()), "-f", str(tmp_path / "embedded.yaml"), "--framework", "kubernetes")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "Passed checks:" in res.stdout
    from pipeline.deploy import dynamo

    for _, folder in list(trees.values()) + [(None, dynamo_tree)]:
        for f, doc in documents(folder):
            for key, value in doc.get("metadata", {}).get("annotations", {}).items():
                if key.startswith("checkov.io/skip"):
                    check, _, why = value.partition("=")
                    assert check in {**k8s.SKIPS, **dynamo.SKIPS} and len(why) > 20, (f, value)


def pod_specs(doc: dict) -> list[dict]:
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]["spec"]]
    t = doc["spec"]["leaderWorkerTemplate"]
    return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]


def test_pods_are_locked_down_and_sized_from_the_build(trees) -> None:
    for cfg, folder in trees.values():
        world = cfg.build.tp_size * cfg.build.pp_size
        for arch in cfg.build.archs:
            overlay = folder / "overlays" / arch
            kust = yaml.safe_load((overlay / "kustomization.yaml").read_text())
            assert kust["namespace"] == cfg.deploy.namespace and "../../base" in kust["resources"]
            (workload,) = [d for f, d in documents(overlay) if d["kind"] in ("Deployment", "LeaderWorkerSet")]
            assert workload["metadata"]["name"] == k8s.workload_name(cfg, cfg.variants[0].name, arch)
            assert "replicas" not in workload["spec"]  # the HPA owns the count
            assert workload["kind"] == (
                "LeaderWorkerSet" if world > cfg.deploy.gpus_per_node else "Deployment"
            )
            for spec in pod_specs(workload):
                terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                expr = {e["key"]: e["values"] for e in terms["nodeSelectorTerms"][0]["matchExpressions"]}
                assert expr["nvidia.com/gpu.compute.major"] == [arch[2:-1]]
                assert expr["nvidia.com/gpu.compute.minor"] == [arch[-1]]
                assert {v["name"]: v for v in spec["volumes"]}["dshm"]["emptyDir"]["medium"] == "Memory"
                triton = spec["containers"][0]
                gpus = triton["resources"]["limits"]["nvidia.com/gpu"]
                assert triton["resources"]["requests"] == triton["resources"]["limits"]
                assert int(gpus) == min(world, cfg.deploy.gpus_per_node)
                for c in spec["containers"] + spec.get("initContainers", []):
                    sc = c["securityContext"]
                    assert (
                        sc["runAsNonRoot"]
                        and sc["readOnlyRootFilesystem"]
                        and not sc["allowPrivilegeEscalation"]
                    )
                    assert sc["capabilities"]["drop"] == ["ALL"]
                    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
                    if c["name"] != "fetch-repository":
                        assert mounts["/models"]["readOnly"] is True
            leader = pod_specs(workload)[0]
            names = [c["name"] for c in leader["containers"]]
            assert names == ["triton", "gateway"]
            triton, gateway = leader["containers"]
            assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
            assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
            assert gateway["readinessProbe"]["httpGet"]["path"] == "/health/ready"
            keys = {v["name"]: v for v in leader["volumes"]}["keys"]["secret"]["secretName"]
            assert keys == cfg.deploy.keys_secret
            if cfg.deploy.repository.url:
                (init,) = leader["initContainers"]
                env = {e["name"]: e["value"] for e in init["env"]}
                assert env["REPOS_URL"] == cfg.deploy.repository.url and "sha256sum" in init["command"][-1]
                assert "-o /tmp" not in init["command"][-1]  # streamed into the volume, never copied
                models = {v["name"]: v for v in leader["volumes"]}["models"]["emptyDir"]
                assert k8s.quantity_bytes(models["sizeLimit"]) >= k8s.quantity_bytes(
                    cfg.deploy.repository.size
                )
                assert init["resources"]["requests"]["ephemeral-storage"] == models["sizeLimit"]
            else:
                claim = {v["name"]: v for v in leader["volumes"]}["models"]["persistentVolumeClaim"]
                assert claim["readOnly"] is True


def test_services_and_autoscaler_point_at_the_workload(trees) -> None:
    cfg, folder = trees["engine-tp8-pp2-lws"]
    docs = {
        (d["kind"], d["metadata"]["name"]): d for _, d in documents(folder) if d["kind"] != "Kustomization"
    }
    name = k8s.app_name(cfg, cfg.variants[0].name)
    lws_name = k8s.workload_name(cfg, cfg.variants[0].name, "sm90")
    hpa = docs[("HorizontalPodAutoscaler", lws_name)]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": lws_name,
    }
    # the LWS controller creates its headless Service under the LWS's name only if none exists (D2)
    assert ("Service", lws_name) not in docs
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "lpx_queue_compute_ratio"
    rules = docs[("PrometheusRule", name)]["spec"]["groups"][0]["rules"]
    assert rules[0]["expr"] == k8s.QUEUE_RATIO_EXPR and "nv_inference_queue_duration_us" in rules[0]["expr"]
    grpc = docs[("Service", f"{name}-grpc")]["spec"]
    assert grpc["clusterIP"] == "None"
    lws = docs[("LeaderWorkerSet", lws_name)]["spec"]["leaderWorkerTemplate"]
    assert (
        lws["size"] == 2 and "/usr/sbin/sshd" in lws["workerTemplate"]["spec"]["containers"][0]["command"][-1]
    )
    pod_labels = lws["leaderTemplate"]["metadata"]["labels"]
    for svc in (docs[("Service", name)], docs[("Service", f"{name}-grpc")]):
        assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())


def test_mpirun_hosts_come_from_the_leaderworkerset_group() -> None:
    env = {"LWS_LEADER_ADDRESS": "lpx-m-v-0.lpx-m-v.lpx.svc.cluster.local", "LWS_GROUP_SIZE": "2"}
    assert mpi_hosts(16, env) == [
        "lpx-m-v-0.lpx-m-v.lpx.svc.cluster.local:8",
        "lpx-m-v-0-1.lpx-m-v.lpx.svc.cluster.local:8",
    ]
    assert mpi_hosts(2, {}) == [] and mpi_hosts(4, {"LPX_MPI_HOSTS": "a:2, b:2"}) == ["a:2", "b:2"]
    with pytest.raises(LpxError, match="do not split evenly"):
        mpi_hosts(6, {**env, "LWS_GROUP_SIZE": "4"})


def fake_llmapi_repo(home: Path, cfg, variant: str) -> Path:
    """A complete repository artifact as the repo stage leaves it (the manifest and the checkpoint folder)."""
    folder = home / "artifacts" / "repos" / cfg.model.name / variant / "any" / "0123456789ab"
    (folder / "tensorrt_llm" / "1" / "engine" / "checkpoint").mkdir(parents=True)
    (folder / "manifest.json").write_text(
        json.dumps({"schema": 1, "key": folder.name, "complete": True, "stage": "repo", "created": 1.0})
    )
    return folder


@pytest.mark.parametrize("api_version", ["v1alpha1", "v1beta1"])
@pytest.mark.parametrize("disagg", [False, True])
def test_dynamo_graph_validates_and_carries_lpx_checked_options(
    tmp_path, monkeypatch, api_version, disagg
) -> None:
    monkeypatch.setenv("LPX_HOME", str(tmp_path / "home"))
    cfg = config("llmapi", archs=("sm90",))
    variant = cfg.variants[0].name
    repo = fake_llmapi_repo(tmp_path / "home", cfg, variant)
    written, commands = deploy_dynamo(cfg, variant, tmp_path / "dyn", disagg=disagg, api_version=api_version)
    docs = {d["kind"]: d for f, d in documents(tmp_path / "dyn") if f.parent == tmp_path / "dyn"}
    graph = docs["DynamoGraphDeployment"]
    files = ["dynamographdeployment.json"] + (
        ["dynamographdeployment-v1.0.2.json"] if api_version == "v1alpha1" else []
    )
    assert docs["Namespace"]["metadata"]["name"] == graph["metadata"]["namespace"]  # D10
    for file in files:
        assert validate(graph, file) == [], validate(graph, file)
    phases = ["prefill", "decode"] if disagg else ["worker"]
    assert sorted(docs["ConfigMap"]["data"]) == sorted(f"{p}.yaml" for p in phases)
    want_path = (
        f"/models/{(repo / 'tensorrt_llm' / '1' / 'engine' / 'checkpoint').relative_to(tmp_path / 'home')}"
    )
    workers = (
        [c for c in graph["spec"]["components"] if c["type"] != "frontend"]
        if api_version == "v1beta1"
        else [s for s in graph["spec"]["services"].values() if s["componentType"] == "worker"]
    )
    assert len(workers) == len(phases)
    for w in workers:
        main = (
            w["podTemplate"]["spec"]["containers"][0]
            if api_version == "v1beta1"
            else w["extraPodSpec"]["mainContainer"]
        )
        args = main["args"]
        assert main["command"] == ["python3", "-m", "dynamo.trtllm"]
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert args[args.index("--model-path") + 1] == want_path
        assert ("--disaggregation-mode" in args) == disagg
    for phase in phases:
        options = yaml.safe_load(docs["ConfigMap"]["data"][f"{phase}.yaml"])
        unknown = sorted(set(options) - set(CONTRACT))
        assert not unknown, f"options Dynamo would pass through unchecked: {unknown}"
        if disagg:
            assert options["cache_transceiver_config"] == {"backend": "DEFAULT"}
            assert options["disable_overlap_scheduler"] is (phase == "prefill")
        assert options["max_seq_len"] == cfg.build.max_seq_len
    assert commands[0].startswith("python3 -m dynamo.frontend") and "--extra-engine-args" in commands[1]


def run_lpx(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_cli_refusals_are_clear(tmp_path) -> None:
    cfg_file = tmp_path / "lpx.yaml"
    data = demo_config_dict("/nonexistent/checkpoint")
    data["build"]["target"] = "llmapi"
    cfg_file.write_text(yaml.safe_dump(data))
    home = {"LPX_HOME": str(tmp_path / "home")}
    res = run_lpx(
        "deploy", "k8s", "-c", str(cfg_file), "--variant", "fp8", "--out", str(tmp_path / "k"), env=home
    )
    assert res.returncode == 2 and "lpx deploy dynamo" in res.stderr and "Traceback" not in res.stderr
    res = run_lpx(
        "deploy", "dynamo", "-c", str(cfg_file), "--variant", "fp8", "--out", str(tmp_path / "d"), env=home
    )
    assert res.returncode == 1 and "run 'lpx repo" in res.stderr and not (tmp_path / "d").exists()
    res = run_lpx(
        "deploy", "dynamo", "-c", str(cfg_file), "--variant", "nope", "--out", str(tmp_path / "d"), env=home
    )
    assert res.returncode == 2 and "No variant 'nope'" in res.stderr


def test_dockerfiles_lint_clean() -> None:
    files = [str(ROOT / name) for name in ("Dockerfile", "Dockerfile.slim", "Dockerfile.vllm")]
    res = subprocess.run([tool("hadolint"), *files], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout
    res = checkov(*(a for f in files for a in ("-f", f)), "--framework", "dockerfile")
    assert res.returncode == 0 and "Passed checks:" in res.stdout, res.stdout
    for file in files:
        text = Path(file).read_text()
        assert "USER 1000" in text and 'VOLUME ["/models"' in text
        for line in text.splitlines():
            if "checkov:skip=" in line:
                assert len(line.split(":", 2)[-1].strip()) > 20, line


def rendered(overlays: list[Path]) -> list[dict]:
    """`kubectl kustomize` of each overlay (what `kubectl apply -k` sends), all of them together: overlays
    of several archs are applied to one cluster."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    objects: dict[tuple, dict] = {}
    for overlay in overlays:
        res = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        for d in yaml.safe_load_all(res.stdout):
            key = (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
            assert key not in objects or objects[key] == d, f"two overlays write {key} differently"
            objects[key] = d
    return list(objects.values())


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_rendered_objects_refer_to_each_other(trees) -> None:
    """Per tree, every overlay rendered together: Services select pods and target their ports, HPA and PDB
    targets exist, the NetworkPolicies open every port one pod of the workload uses on another, and no
    Service has a LeaderWorkerSet's name (its controller would not create the group's headless Service)."""
    for name, (cfg, folder) in trees.items():
        objs = rendered([folder / "overlays" / arch for arch in cfg.build.archs])
        by_kind: dict[str, list[dict]] = {}
        for o in objs:
            by_kind.setdefault(o["kind"], []).append(o)
        pods = []  # (labels, spec) of every pod template
        for w in by_kind.get("Deployment", []) + by_kind.get("LeaderWorkerSet", []):
            if w["kind"] == "Deployment":
                t = w["spec"]["template"]
                assert selects(w["spec"]["selector"]["matchLabels"], t["metadata"]["labels"])
                pods.append((t["metadata"]["labels"], t["spec"]))
            else:
                t = w["spec"]["leaderWorkerTemplate"]
                for role in ("leaderTemplate", "workerTemplate"):
                    lbl = {
                        **t[role]["metadata"]["labels"],
                        "leaderworkerset.sigs.k8s.io/name": w["metadata"]["name"],
                    }
                    pods.append((lbl, t[role]["spec"]))
        assert len(
            {
                w["metadata"]["name"]
                for w in by_kind.get("Deployment", []) + by_kind.get("LeaderWorkerSet", [])
            }
        ) == len(cfg.build.archs), name
        for svc in by_kind["Service"]:
            chosen = [spec for lbl, spec in pods if selects(svc["spec"]["selector"], lbl)]
            assert chosen, (name, svc["metadata"]["name"], "selects no pod")
            for port in svc["spec"]["ports"]:
                for spec in chosen:
                    names = {p.get("name") for c in spec["containers"] for p in c.get("ports", [])}
                    assert port["targetPort"] in names, (name, svc["metadata"]["name"], port)
        lws_names = {w["metadata"]["name"] for w in by_kind.get("LeaderWorkerSet", [])}
        assert not lws_names & {s["metadata"]["name"] for s in by_kind["Service"]}, name
        targets = {(w["kind"], w["metadata"]["name"]) for w in objs}
        for hpa in by_kind["HorizontalPodAutoscaler"]:
            ref = hpa["spec"]["scaleTargetRef"]
            assert (ref["kind"], ref["name"]) in targets, (name, ref)
        for pdb in by_kind.get("PodDisruptionBudget", []):
            assert any(selects(pdb["spec"]["selector"]["matchLabels"], lbl) for lbl, _ in pods), name
        # ports one pod uses on another: the LWS leader's mpirun reaches the workers' sshd, and every
        # port (MPI, NCCL) between the group's pods; Services' ports from clients
        policies = by_kind["NetworkPolicy"]
        for lbl, spec in pods:
            for c in spec["containers"]:
                for p in c.get("ports", []):
                    allowed = [
                        rule
                        for pol in policies
                        if selects(pol["spec"]["podSelector"]["matchLabels"], lbl)
                        for rule in pol["spec"]["ingress"]
                        if "ports" not in rule or p["containerPort"] in [r["port"] for r in rule["ports"]]
                    ]
                    assert allowed, (name, c["name"], p)
            if lbl.get("app.kubernetes.io/component") == "worker":  # reached on any port from its leader
                leader = next(
                    x
                    for x, _ in pods
                    if x.get("app.kubernetes.io/component") == "server"
                    and x.get("leaderworkerset.sigs.k8s.io/name") == lbl["leaderworkerset.sigs.k8s.io/name"]
                )
                open_all = [
                    rule
                    for pol in policies
                    if selects(pol["spec"]["podSelector"]["matchLabels"], lbl)
                    for rule in pol["spec"]["ingress"]
                    if "ports" not in rule
                    and any(
                        selects(f.get("podSelector", {}).get("matchLabels", {}), leader) for f in rule["from"]
                    )
                ]
                assert open_all, (name, "the group's ports are closed to its leader")


def test_variant_defaults_to_the_only_one(tmp_path) -> None:
    """`lpx deploy k8s` without --variant deploys the config's only variant (the demo's), and names the
    choice when there are several (D14): in-process for the first, the real CLI for the refusal."""
    from click.testing import CliRunner

    from pipeline.cli.deploy import deploy

    data = demo_config_dict("/nonexistent/checkpoint")
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(deploy, ["k8s", "-c", str(tmp_path / "one.yaml"), "--out", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output
    assert list((tmp_path / "k" / "overlays").glob("*/deployment-lpx-tiny-llama-fp8-*.yaml"))
    data["variants"].append({**data["variants"][0], "name": "fp8b"})
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(data))
    res = run_lpx("deploy", "k8s", "-c", str(tmp_path / "two.yaml"), "--out", str(tmp_path / "k2"))
    assert res.returncode == 2 and "pick one with --variant" in res.stderr, res.stderr
    assert not (tmp_path / "k2").exists()
