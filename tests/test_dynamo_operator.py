"""The pods Dynamo's operator makes of LPX's DynamoGraphDeployment, as tests/contracts/dynamo_operator.json
says the operator makes them (ai-dynamo/dynamo's operator and runtime source at the pinned commit, and the
runtime 1.6.1 wheel): with Kubernetes discovery, the operator's default, every pod must run under the
graph's `<graph>-k8s-service-discovery` account (whose Role grants the DynamoWorkerMetadata objects through
which frontend and workers find each other) and mount its token, which the runtime's Kubernetes client
reads. Issue 42: every v1beta1 component set automountServiceAccountToken: false, so no worker could
register and the frontend saw none. In-process, < 2 s."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from test_pods_upstream import config, fake_repo

from pipeline.deploy import dynamo

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "dynamo_operator.json").read_text())
FACTS = CONTRACT["facts"]
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def pod_templates(graph: dict) -> list[tuple[str, dict]]:
    """(component, pod spec) of every component: v1beta1 podTemplate.spec, v1alpha1 extraPodSpec (a PodSpec
    with mainContainer beside it)."""
    if "components" in graph["spec"]:
        return [(c["name"], c["podTemplate"]["spec"]) for c in graph["spec"]["components"]]
    out = []
    for name, service in graph["spec"]["services"].items():
        spec = {k: v for k, v in service.get("extraPodSpec", {}).items() if k != "mainContainer"}
        out.append((name, spec))
    return out


def discovery_enabled(graph: dict) -> bool:
    """The operator's IsK8sDiscoveryEnabled: the graph's annotation, else the operator's default backend."""
    fact = FACTS["backend_annotation"]
    annotations = graph["metadata"].get("annotations", {})
    backend = annotations.get(fact["annotation"], FACTS["default_backend"]["default"])
    return backend == fact["enabled_value"]


def account(graph: dict) -> str:
    return FACTS["service_account"]["name_format"].format(dgd=graph["metadata"]["name"])


def operator_pod(graph: dict, spec: dict) -> dict:
    """The pod spec the operator derives from a component's: the component's fields win over the
    operator's base (mergo.WithOverride; the operator's base sets neither field looked at here), then the
    discovery account where the component names none (pod_spec_merge, token_mount_untouched)."""
    pod = copy.deepcopy(spec)
    if discovery_enabled(graph) and not pod.get("serviceAccountName"):
        pod["serviceAccountName"] = account(graph)
    return pod


def discovery_problems(graph: dict) -> list[str]:
    """What keeps a pod of the graph from Kubernetes discovery, one line per pod and cause."""
    if not discovery_enabled(graph):
        return ["Kubernetes discovery is off for the graph: the operator makes no account, Role or binding"]
    out = []
    for name, spec in pod_templates(graph):
        pod = operator_pod(graph, spec)
        # Kubernetes mounts the token unless the pod (or its account, which the operator leaves unset) says no
        if pod.get("automountServiceAccountToken", True) is not True:
            out.append(f"{name}: no service account token, so the runtime's Kubernetes client cannot start")
        if pod["serviceAccountName"] != account(graph):
            out.append(f"{name}: runs as {pod['serviceAccountName']}, which has no discovery Role")
    return out


def graphs(tmp_path: Path, monkeypatch) -> list[dict]:
    """Every graph `lpx deploy dynamo` writes: llmapi and vllm, aggregated and disaggregated, v1beta1 and
    v1alpha1."""
    out = []
    for target in ("llmapi", "vllm"):
        monkeypatch.setenv("LPX_HOME", str(tmp_path / target))
        cfg = config(target)
        fake_repo(tmp_path / target, cfg)
        for api_version in ("v1beta1", "v1alpha1"):
            for disagg in (False, True):
                docs = dynamo.dynamo_objects(
                    cfg, cfg.variants[0].name, disagg=disagg, api_version=api_version
                )
                out += [d for d in docs if d["kind"] == "DynamoGraphDeployment"]
    return out


def test_every_pod_of_every_graph_runs_under_the_discovery_account_with_its_token(
    tmp_path, monkeypatch
) -> None:
    found = graphs(tmp_path, monkeypatch)
    assert len(found) == 8
    for graph in found:
        pods = pod_templates(graph)
        assert len(pods) in (2, 3)  # the frontend and one worker, or prefill and decode
        assert discovery_problems(graph) == [], graph["apiVersion"]
        name = account(graph)
        for suffix in (
            "",
            FACTS["service_account"]["role_suffix"],
            FACTS["service_account"]["binding_suffix"],
        ):
            assert len(name + suffix) <= 253 and DNS_SUBDOMAIN.match(name + suffix), name + suffix


def test_the_role_grants_what_the_runtime_does_with_worker_metadata() -> None:
    """The contract holds together: the verbs the runtime uses on DynamoWorkerMetadata are the Role's."""
    metadata = FACTS["worker_metadata"]
    (rule,) = [r for r in FACTS["role_rules"]["rules"] if metadata["plural"] in r["resources"]]
    assert rule["apiGroups"] == [metadata["group"]]
    assert set(metadata["verbs_used"]) <= set(rule["verbs"])
    assert "/var/run/secrets/kubernetes.io/serviceaccount/token" in CONTRACT["wheel"]["core_strings"]


@pytest.mark.parametrize(
    "change, cause",
    [
        (lambda spec: spec.update(automountServiceAccountToken=False), "no service account token"),
        (lambda spec: spec.update(serviceAccountName="default"), "no discovery Role"),
    ],
)
def test_the_check_fails_on_what_it_guards(tmp_path, monkeypatch, change, cause) -> None:
    """What 2eeb7c6 wrote (automountServiceAccountToken: false) and an account of the graph's own are both
    caught, in either tree; so is a graph that turns Kubernetes discovery off."""
    found = graphs(tmp_path, monkeypatch)
    for graph in found[:2]:
        beta = copy.deepcopy(graph)
        change(beta["spec"]["components"][1]["podTemplate"]["spec"])
        assert [p for p in discovery_problems(beta) if cause in p], beta
    alpha = copy.deepcopy([g for g in found if g["apiVersion"].endswith("v1alpha1")][0])
    change(next(iter(alpha["spec"]["services"].values()))["extraPodSpec"])
    assert [p for p in discovery_problems(alpha) if cause in p]
    off = copy.deepcopy(alpha)
    off["metadata"]["annotations"][FACTS["backend_annotation"]["annotation"]] = "etcd"
    assert discovery_problems(off)[0].startswith("Kubernetes discovery is off")
