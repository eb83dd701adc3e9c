"""pipeline/bench/trace_join.py: the joins of scripts/bench_vllm.py --trace over records written by the real
trace (pipeline/trace.py, LPX_TRACE, in a child process as the serving hops write them) and read back by
trace.read: each token's time in each hop, each request's path to its first token (its steps add up to the
TTFT), what an incomplete trace leaves out, and the tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import trace
from pipeline.bench.trace_join import HOPS, PATH, Joined, request_path, timeline, trace_table, triton_id

ROOT = Path(__file__).resolve().parents[1]
MS = 0.001


def traced(folder: Path, records: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """`records` (hop, fields) written by trace.mark in a child with LPX_TRACE=folder, then trace.read."""
    code = "import json, sys\nfrom pipeline import trace\nfor hop, f in json.load(sys.stdin):\n    trace.mark(hop, **f)\n"
    env = {k: v for k, v in os.environ.items() if k != "LPX_TRACE"} | {"LPX_TRACE": str(folder)}
    subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(records), text=True, check=True, env=env, cwd=ROOT
    )
    return trace.read(folder)


def one_request(tid: str = "req-ab", rid: str = "lpx-7", base: float = 100.0) -> list[tuple[str, dict]]:
    """One streamed request, two deltas (1 token, then 3 so far) through every hop; each step a known
    number of milliseconds after `base`."""
    t = lambda ms: base + ms * MS  # noqa: E731
    out = [
        ("request", {"at": "gateway", "tid": tid, "t": t(1)}),
        ("request", {"at": "stub", "tid": tid, "t": t(3)}),
        ("request", {"at": "submit", "tid": tid, "t": t(6)}),
        ("worker", {"id": rid, "n": 0, "t": t(10)}),
        ("worker", {"id": rid, "n": 1, "core": t(30), "t": t(31), "queued_ts": t(15), "scheduled_ts": t(21)}),
        ("worker", {"id": rid, "n": 3, "core": t(60), "t": t(61)}),
    ]
    for n, at in ((1, 30), (3, 60)):
        out += [
            ("reader", {"id": rid, "n": n, "t": t(at + 3)}),
            ("taken", {"id": rid, "n": n, "t": t(at + 6)}),
            ("stub", {"id": rid, "tid": tid, "n": n, "t": t(at + 10)}),
            ("gateway", {"id": tid, "n": n, "t": t(at + 15)}),
        ]
    out.append(("gateway", {"id": tid, "n": 3, "t": t(77)}))  # the empty final response: no token
    return out


def client(tid_suffix: str = "ab", base: float = 100.0) -> dict:
    return {"id": f"cmpl-{tid_suffix}", "sent": base, "chunks": [base + 51 * MS, base + 81 * MS]}


def test_each_token_gets_its_hop_times(tmp_path):
    records = traced(tmp_path / "t", one_request() + one_request("req-cd", "lpx-8", 200.0))
    assert {"worker", "reader", "taken", "stub", "gateway", "request"} <= set(records)
    spent = timeline(records, [client()])
    expected = [1, 2, 3, 4, 5, 6]  # the hops, in HOPS' order, for each of the two deltas
    for (name, _, _), ms in zip(HOPS, expected, strict=True):
        assert spent[name] == pytest.approx([ms, ms], abs=1e-6), name
    assert spent["engine core -> client (first token)"] == pytest.approx([21.0], abs=1e-6)
    assert spent["engine core -> client (later tokens)"] == pytest.approx([21.0], abs=1e-6)
    both = timeline(records, [client(), client("cd", 200.0), {"id": None, "sent": 0.0, "chunks": []}])
    assert len(both["worker -> stub's reader"]) == 4  # two requests joined, the one without an id left out


def test_the_request_path_telescopes_to_the_ttft(tmp_path):
    records = traced(tmp_path / "t", one_request())
    path = request_path(records, [client()])
    steps = {name: values for name, values in path.items()}
    want = {
        "client -> gateway's gRPC call": 1,
        "gRPC call -> stub's execute()": 2,
        "execute() -> handing it to the engine": 3,
        "handing it on -> worker read it": 4,
        "worker read -> engine core queued": 5,
        "queued -> scheduled": 6,
        "scheduled -> first token (prefill)": 9,
        "TTFT (client)": 51,
    }
    for name, ms in want.items():
        assert steps[name] == pytest.approx([ms], abs=1e-6), name
    assert sum(path[name][0] for name, _, _ in PATH[:-1]) == pytest.approx(path["TTFT (client)"][0], abs=1e-6)


def test_a_missing_hop_leaves_out_only_its_steps(tmp_path):
    records = traced(tmp_path / "t", [r for r in one_request() if r[0] not in ("reader", "request")])
    spent = timeline(records, [client()])
    assert spent["worker -> stub's reader"] == [] and spent["reader -> request thread"] == []
    assert spent["Triton send -> gateway got"] == pytest.approx([5, 5], abs=1e-6)
    path = request_path(records, [client(), {"id": "cmpl-zz", "sent": 1.0, "chunks": []}])
    assert path["client -> gateway's gRPC call"] == []  # no `request` hop
    assert path["queued -> scheduled"] == pytest.approx([6], abs=1e-6)
    assert len(path["TTFT (client)"]) == 1  # the request without chunks is left out


def test_joined_keys_and_ids(tmp_path):
    joined = Joined(traced(tmp_path / "t", one_request()))
    assert [r["n"] for r in joined.gateway["req-ab"]] == [1, 3]  # the empty final response dropped
    assert joined.got["lpx-7"]["n"] == 0 and joined.first["lpx-7"]["n"] == 1
    rid, points = joined.token("req-ab", joined.gateway["req-ab"][1], None)
    assert rid == "lpx-7" and points["client"] is None and points["core"] == pytest.approx(100.06)
    assert triton_id("cmpl-ab") == "req-ab" and triton_id("chatcmpl-x-y") == "req-x-y"


def test_trace_table_medians_means_and_gaps():
    spent = {
        1: {"a": [1.0, 2.0, 9.0], "b": []},
        4: {"a": [4.0] * 9 + [40.0], "b": [0.5]},
    }  # p90: the 10th of 10
    table = trace_table([1, 4], spent).splitlines()
    assert table[0] == "| hop | c=1 p50 (p90) ms | c=4 p50 (p90) ms |"
    assert table[2] == "| a | 2.00 (9.00) | 4.00 (40.00) |"
    assert table[3] == "| b | - | 0.50 (0.50) |"
    assert trace_table([1], spent, mean=True).splitlines()[2] == "| a | 4.00 (9.00) |"
