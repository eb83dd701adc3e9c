"""`lpx monitoring`'s rules and dashboard, and the metric vocabulary behind them, checked with real tools:
promtool checks every rule and runs the unit tests in tests/data/monitoring/rules_test.yml (synthetic
series, every alert firing and quiet); the dashboard's queries parse and name only families Triton, the
gateway or the TensorRT-LLM backend publish (tests/contracts/trtllm_backend_metrics.json)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from crd_schema import validate
from helpers_monitoring import tool

from pipeline.monitoring import dashboard, promql
from pipeline.monitoring.rules import Thresholds, rule_groups
from pipeline.monitoring.scrape import metrics_url, parse, quantile, rate
from pipeline.monitoring.write import write_monitoring
from pipeline.runtime.trtllm_metrics import FAMILIES, TOKEN_BUCKETS, backend_stats

HERE = Path(__file__).parent
CONTRACT = json.loads((HERE / "contracts" / "trtllm_backend_metrics.json").read_text())
RULE_TESTS = HERE / "data" / "monitoring" / "rules_test.yml"
PROMQL_WORDS = {"by", "without", "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool"}


def test_lpx_publishes_the_backends_families_as_the_contract_pins_them() -> None:
    """Same names, kinds, help texts, category labels, label values and buckets as the C++ backend, and
    every family of an in-flight batching model (the v1 family is for static batching only)."""
    families = CONTRACT["families"]
    ours = {name: (kind, label, [v for v, _ in values], text) for name, text, kind, label, values in FAMILIES}
    assert set(ours) == set(families) - {"nv_trt_llm_v1_metrics"}
    for name, (kind, label, values, text) in ours.items():
        pinned = families[name]
        assert (kind, label, text) == (pinned["type"], pinned["label"], pinned["help"]), name
        assert sorted(values) == sorted(pinned["values"]), name
        keys = {v: spec["key"] for v, spec in pinned["values"].items()}
        assert {v: k for v, k in next(f[4] for f in FAMILIES if f[0] == name)} == keys, name
        if kind == "histogram":
            assert list(TOKEN_BUCKETS) == pinned["buckets"]


def test_backend_stats_are_the_backends_keys() -> None:
    """IterationStats -> the backend's keys as its WaitForStats writes them: waiting = active - scheduled,
    the used fraction, the timestamp in microseconds."""
    stats = backend_stats(
        {
            "timestamp": "12-03-2026 10:00:00.250000",
            "iter": 7,
            "numActiveRequests": 10,
            "maxNumActiveRequests": 8,
            "gpuMemUsage": 3,
            "kvCacheStats": {
                "maxNumBlocks": 256,
                "freeNumBlocks": 192,
                "usedNumBlocks": 64,
                "tokensPerBlock": 32,
            },
            "inflightBatchingStats": {"numScheduledRequests": 8, "numContextRequests": 2, "numCtxTokens": 40},
        }
    )
    keys = {key for family in FAMILIES for _, key in family[4]}
    assert set(stats) <= keys
    assert stats["Waiting Requests"] == 2 and stats["Fraction used KV cache blocks"] == 0.25
    assert stats["Iteration Counter"] == 7 and stats["Total Context Tokens"] == 40
    assert stats["Timestamp"] % 1e6 == 250000, "microseconds, with the sub-second part"
    bare = backend_stats({"numActiveRequests": 1})
    assert "Waiting Requests" not in bare and "Used KV cache blocks" not in bare, "absent stats set nothing"


@pytest.fixture
def written(tmp_path) -> Path:
    write_monitoring(tmp_path / "mon")
    return tmp_path / "mon"


def test_promtool_checks_the_rules_and_their_unit_tests_pass(written: Path) -> None:
    promtool = tool("promtool")
    check = subprocess.run(
        [str(promtool), "check", "rules", str(written / "prometheus-rules.yml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    n_rules = sum(len(g["rules"]) for g in rule_groups())
    assert f"SUCCESS: {n_rules} rules found" in check.stdout
    shutil.copy(RULE_TESTS, written / "rules_test.yml")
    unit = subprocess.run(
        [str(promtool), "test", "rules", "rules_test.yml"], cwd=written, capture_output=True, text=True
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout


def test_every_rule_has_a_unit_test() -> None:
    """Each recorded series is evaluated, and each alert has a case where it fires and one where it is quiet."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    records = {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    alerts = {r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r}
    evaluated = {e["expr"] for t in tests for e in t.get("promql_expr_test", [])}
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert records <= evaluated and alerts == firing and alerts <= quiet | {"LpxQueueTimeRising"}
    rising = next(t for t in tests if "rising" in t["name"])
    assert {s["series"].split("pod=")[1] for s in rising["input_series"]} == {'"rising"}', '"steady"}'}, (
        "the queue alert's quiet case is a steady ratio above the threshold in the same test"
    )


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, groupings and ranges left out)."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", bare)
    return {n for n in names if n not in PROMQL_WORDS}


def documented(name: str) -> bool:
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    if name.startswith("lpx:"):
        return name in {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    if base.startswith(("nv_trt_llm_", "nv_llm_")):
        return base in CONTRACT["families"]
    triton = name.startswith(("nv_inference_", "nv_gpu_", "nv_cpu_"))
    gateway = name in {getattr(promql, a) for a in dir(promql) if a.startswith("GATEWAY_")} or base in {
        getattr(promql, a) for a in dir(promql) if a.startswith("GATEWAY_")
    }
    return triton or gateway


def test_dashboard_and_rules_name_only_documented_families(written: Path) -> None:
    """Every query of the dashboard parses (promtool, as recording rules) and, like every rule, reads only
    Triton's, the gateway's and the TensorRT-LLM backend's families, or LPX's recorded series."""
    queries = [
        q.replace("$__rate_interval", "1m").replace("$namespace", ".*").replace("$pod", ".*")
        for q in dashboard.queries()
    ]
    rules = [r["expr"] for g in rule_groups() for r in g["rules"]]
    names = set().union(*(metric_names(e) for e in queries + rules))
    assert {"nv_trt_llm_request_metrics", "nv_llm_output_token_len_sum", "lpx:queue_compute_ratio"} <= names
    assert [n for n in sorted(names) if not documented(n)] == []
    check = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"q:{i}", "expr": e} for i, e in enumerate(queries)]}
        ]
    }
    (written / "dashboard-queries.yml").write_text(yaml.safe_dump(check))
    res = subprocess.run(
        [str(tool("promtool")), "check", "rules", str(written / "dashboard-queries.yml")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_written_files(written: Path) -> None:
    board = json.loads((written / "dashboard.json").read_text())
    assert board["uid"] == dashboard.UID and board["title"] == dashboard.TITLE
    panels = [p for p in board["panels"] if p["type"] == "timeseries"]
    assert [p["title"] for p in panels] == [t for _, row in dashboard.PANELS for t, _, _ in row]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    assert all(t["refId"] and t["expr"] for p in panels for t in p["targets"])
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "namespace", "pod"}
    cm = yaml.safe_load((written / "grafana-dashboard-configmap.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"][f"{dashboard.UID}.json"]) == board
    rule = yaml.safe_load((written / "prometheus-rule.yaml").read_text())
    assert validate(rule) == [], validate(rule)
    assert rule["spec"]["groups"] == yaml.safe_load((written / "prometheus-rules.yml").read_text())["groups"]
    from pipeline.deploy.k8s import QUEUE_RATIO, QUEUE_RATIO_EXPR

    assert rule["spec"]["groups"][0]["rules"] == [{"record": QUEUE_RATIO, "expr": QUEUE_RATIO_EXPR}]


def test_monitoring_command_thresholds_and_refusals(tmp_path) -> None:
    from pipeline.cli import cli

    out = tmp_path / "m"
    res = CliRunner().invoke(
        cli, ["monitoring", "--out", str(out), "--slo", "ttft=500ms", "--kv-cache", "0.8"]
    )
    assert res.exit_code == 0, res.output
    alerts = {
        r["alert"]: r
        for g in yaml.safe_load((out / "prometheus-rules.yml").read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert alerts["LpxTTFTAboveSLO"]["expr"].endswith("> 0.5") and alerts["LpxKVCacheNearlyFull"][
        "expr"
    ].endswith("> 0.8")
    assert alerts["LpxHighErrorRate"]["expr"].endswith(f"> {Thresholds().error_ratio:g}")
    res = CliRunner().invoke(cli, ["monitoring", "--out", str(out), "--no-autoscaling-rule"])
    groups = yaml.safe_load((out / "prometheus-rule.yaml").read_text())["spec"]["groups"]
    assert res.exit_code == 0 and [g["name"] for g in groups] == ["lpx.serving", "lpx.alerts"], (
        "lpx deploy's PrometheusRule records the queue/compute ratio; the alert on it stays"
    )
    for args, message in (
        (["--slo", "itl=5ms"], "only ttft has an alert"),
        (["--gpu-memory", "0"], "must be above 0"),
    ):
        res = CliRunner().invoke(cli, ["monitoring", "--out", str(out), *args])
        assert res.exit_code != 0 and message in str(res.exception or res.output)
    (tmp_path / "file").write_text("")
    res = CliRunner().invoke(cli, ["monitoring", "--out", str(tmp_path / "file")])
    assert "is a file" in str(res.exception)


def test_rates_and_quantiles_between_two_reads() -> None:
    """What lpx top computes: a counter's rate (Triton's un-suffixed counters read as written) and a
    histogram's quantile over the window, interpolated as PromQL does (the rules' unit test gets 0.4975)."""
    head = "# TYPE nv_inference_request_success counter\n# TYPE h histogram\n"

    def text(n: int, in_bucket: int) -> str:
        return head + (
            f'nv_inference_request_success{{model="tensorrt_llm",version="1"}} {n}\n'
            f'h_bucket{{le="0.25"}} 0\nh_bucket{{le="0.5"}} {in_bucket}\nh_bucket{{le="+Inf"}} {in_bucket}\n'
            f"h_sum 1\nh_count {in_bucket}\n"
        )

    a, b = parse(text(10, 5), at=100.0), parse(text(70, 65), at=160.0)
    assert rate(a, b, "nv_inference_request_success", model="tensorrt_llm") == 1.0
    assert rate(a, b, "nv_inference_request_success", model="ensemble") is None
    assert quantile(0.99, a, b, "h") == pytest.approx(0.4975)
    assert quantile(0.5, a, a, "h") is None, "no observations in an empty window"
    assert metrics_url("127.0.0.1:8002") == "http://127.0.0.1:8002/metrics"
    assert metrics_url("http://gw:9000/") == "http://gw:9000/metrics"
    assert metrics_url("http://gw:9000/custom") == "http://gw:9000/custom"


def test_top_names_the_fix_when_there_is_nothing_to_read(tmp_path) -> None:
    """No running lpx serve, or nothing on the port: one message naming the fix, exit code 1."""
    import socket

    from pipeline.cli import cli
    from pipeline.errors import NotFound

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    for args, message in (
        (["--once"], "No running 'lpx serve' found"),
        (["--url", f"127.0.0.1:{port}", "--once"], "No metrics at"),
    ):
        res = CliRunner().invoke(cli, ["top", *args])
        assert isinstance(res.exception, NotFound) and res.exception.exit_code == 1, res.output
        assert message in res.exception.message and "--url" in res.exception.message
    res = CliRunner().invoke(cli, ["top", "--interval", "0", "--url", "x:1"])
    assert res.exception.exit_code == 2 and "--interval" in res.exception.message
