"""The opt-in serving trace (pipeline/trace.py, LPX_TRACE): off by default, its records round-trip, and
scripts/bench_vllm.py's join puts each token's hop times together. The trace through real servers is
tests/test_vllm_serving.py::test_the_trace_follows_each_token_through_every_hop."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import trace

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_vllm", ROOT / "scripts" / "bench_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _python(code: str, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k != "LPX_TRACE"} | env | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=full
    ).stdout


def test_off_unless_asked_and_records_round_trip(tmp_path):
    assert _python("from pipeline import trace; print(trace.ON)").strip() == "False"
    folder = tmp_path / "trace"
    code = (
        "from pipeline import trace\n"
        "trace.mark('stub', id='lpx-0', tid='req-1', n=1)\n"
        "trace.mark('stub', id='lpx-0', tid='req-1', n=3, t=5.0)\n"
        "trace.mark('gateway', id='req-1', n=3)\n"
    )
    _python(code, LPX_TRACE=str(folder))
    files = sorted(p.name.rsplit("-", 1)[0] for p in folder.iterdir())
    assert files == ["gateway", "stub"]
    (folder / "stub-999.jsonl").write_text('{"id": "x", "n": 1, "t": 1.0}\n{"id": "x", "n"')  # mid-write
    records = trace.read(folder)
    assert [r["n"] for r in records["stub"] if r["id"] == "lpx-0"] == [1, 3]
    assert records["stub"][1]["t"] == 5.0
    assert len(records["stub"]) == 3  # the half-written line is left out, the whole one kept
    assert records["gateway"][0]["id"] == "req-1" and records["gateway"][0]["t"] > 0


def test_the_join_gives_each_token_its_hop_times():
    bench = _bench()
    ms = 0.001
    records = {  # one request, two deltas (1 token, then 2): every hop a known number of milliseconds
        "worker": [
            {"id": "lpx-7", "n": 1, "core": 10.0, "t": 10.0 + 1 * ms},
            {"id": "lpx-7", "n": 3, "core": 20.0, "t": 20.0 + 1 * ms},
        ],
        "reader": [{"id": "lpx-7", "n": n, "t": t + 3 * ms} for n, t in ((1, 10.0), (3, 20.0))],
        "taken": [{"id": "lpx-7", "n": n, "t": t + 6 * ms} for n, t in ((1, 10.0), (3, 20.0))],
        "stub": [
            {"id": "lpx-7", "tid": "req-ab", "n": n, "t": t + 10 * ms} for n, t in ((1, 10.0), (3, 20.0))
        ],
        "gateway": [
            {"id": "req-ab", "n": 1, "t": 10.0 + 15 * ms},
            {"id": "req-ab", "n": 3, "t": 20.0 + 15 * ms},
            {"id": "req-ab", "n": 3, "t": 20.0 + 16 * ms},  # the empty final response: no token
            {"id": "req-other", "n": 1, "t": 1.0},
        ],
    }
    requests = [{"id": "cmpl-ab", "sent": 9.0, "chunks": [10.0 + 21 * ms, 20.0 + 21 * ms]}]
    spent = bench.timeline(records, requests)
    expected = {  # hop -> ms, for each of the two deltas
        "engine core -> worker sent": 1,
        "worker -> stub's reader": 2,
        "reader -> request thread": 3,
        "request thread -> Triton send": 4,
        "Triton send -> gateway got": 5,
        "gateway got -> client got": 6,
    }
    for hop, value in expected.items():
        assert spent[hop] == pytest.approx([value, value], abs=1e-6), hop
    assert spent["engine core -> client (first token)"] == pytest.approx([21.0], abs=1e-6)
    assert spent["engine core -> client (later tokens)"] == pytest.approx([21.0], abs=1e-6)
    table = bench.trace_table([1], {1: spent})
    assert "| Triton send -> gateway got | 5.00 (5.00) |" in table
    json.dumps(spent)  # plain numbers: the script can write them out
