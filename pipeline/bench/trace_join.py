"""The serving trace's joins (pipeline/trace.py, LPX_TRACE): each token's time in each hop, and each request's
path to its first token, from the hops' records and the client's own receipts; and their tables.

`records` is trace.read()'s: hop name -> its JSON lines. `requests` is what a client measured, one dict per
streamed completion: `id` (the gateway's response id), `sent` and `chunks` (CLOCK_MONOTONIC, the trace's
clock: when it sent the request, and when each chunk with text arrived). scripts/bench_vllm.py --trace
sends them (pipeline/bench/vllm_measure.py).
"""

from __future__ import annotations

import statistics

HOPS = (  # (name, from, to): the trace's points in the order a token passes them
    ("engine core -> worker sent", "core", "worker"),
    ("worker -> stub's reader", "worker", "reader"),
    ("reader -> request thread", "reader", "taken"),
    ("request thread -> Triton send", "taken", "stub"),
    ("Triton send -> gateway got", "stub", "gateway"),
    ("gateway got -> client got", "gateway", "client"),
)


def triton_id(response_id: str) -> str:
    """Triton's request id of a gateway answer (the gateway names both after one suffix)."""
    return "req-" + response_id.split("-", 1)[1]


class Joined:
    """The trace's records keyed for the joins: each token hop's by (id, tokens so far), the gateway's
    responses with tokens per Triton id in order, the `request` hop's by (at, Triton id), and per engine id
    the worker's read of the request (its n=0 record) and its first delta."""

    def __init__(self, records: dict[str, list[dict]]) -> None:
        by = lambda hop, key="id": {(r[key], r["n"]): r for r in records.get(hop, [])}  # noqa: E731
        self.worker, self.reader, self.taken, self.stub = (
            by("worker"),
            by("reader"),
            by("taken"),
            by("stub", "tid"),
        )
        self.gateway: dict[str, list[dict]] = {}
        for r in sorted(records.get("gateway", []), key=lambda r: r["t"]):
            got = self.gateway.setdefault(r["id"], [])
            if r["n"] > (got[-1]["n"] if got else 0):  # an empty (final) response carries no token
                got.append(r)
        self.request = {(r["at"], r["tid"]): r for r in records.get("request", [])}
        self.got: dict[str, dict] = {}
        self.first: dict[str, dict] = {}
        for r in records.get("worker", []):
            if r["n"] == 0:
                self.got[r["id"]] = r
            elif r["id"] not in self.first or r["n"] < self.first[r["id"]]["n"]:
                self.first[r["id"]] = r

    def token(self, tid: str, reply: dict, client: float | None) -> tuple[str | None, dict]:
        """The engine's id and HOPS' points of one gateway response (`reply`: tokens so far `n`, time `t`)."""
        n = reply.get("n")
        stub = self.stub.get((tid, n)) or {}
        rid = stub.get("id")
        worker = self.worker.get((rid, n)) or {}
        return rid, {
            "core": worker.get("core"),
            "worker": worker.get("t"),
            "reader": (self.reader.get((rid, n)) or {}).get("t"),
            "taken": (self.taken.get((rid, n)) or {}).get("t"),
            "stub": stub.get("t"),
            "gateway": reply.get("t"),
            "client": client,
        }


def timeline(records: dict[str, list[dict]], requests: list[dict]) -> dict[str, list[float]]:
    """hop name -> the milliseconds each token of `requests` spent in it (joined on request and tokens so
    far; the client's k-th chunk with text is the gateway's k-th response with tokens)."""
    joined = Joined(records)
    spent: dict[str, list[float]] = {name: [] for name, _, _ in HOPS}
    spent["engine core -> client (first token)"], spent["engine core -> client (later tokens)"] = [], []
    for req in requests:
        if not req["id"]:
            continue
        tid = triton_id(req["id"])
        for k, reply in enumerate(joined.gateway.get(tid, [])):
            _, points = joined.token(tid, reply, req["chunks"][k] if k < len(req["chunks"]) else None)
            for name, a, b in HOPS:
                if points[a] is not None and points[b] is not None:
                    spent[name].append((points[b] - points[a]) * 1000)
            if points["core"] is not None and points["client"] is not None:
                key = "first token" if k == 0 else "later tokens"
                spent[f"engine core -> client ({key})"].append((points["client"] - points["core"]) * 1000)
    return spent


PATH = (  # (name, from, to): a request's path to its first token, in order
    ("client -> gateway's gRPC call", "sent", "call"),
    ("gRPC call -> stub's execute()", "call", "execute"),
    ("execute() -> handing it to the engine", "execute", "submit"),
    ("handing it on -> worker read it", "submit", "got"),
    ("worker read -> engine core queued", "got", "queued"),
    ("queued -> scheduled", "queued", "scheduled"),
    ("scheduled -> first token (prefill)", "scheduled", "core"),
    *((f"first token: {name}", a, b) for name, a, b in HOPS),
    ("TTFT (client)", "sent", "client"),
)


def request_path(records: dict[str, list[dict]], requests: list[dict]) -> dict[str, list[float]]:
    """step name -> the milliseconds each request of `requests` spent in it before its first token
    reached the client (the `request` hop's records, the worker's n=0 record and its first delta's; the
    engine's id from the stub's record of the first response)."""
    joined = Joined(records)
    spent: dict[str, list[float]] = {name: [] for name, _, _ in PATH}
    for req in requests:
        if not req["id"] or not req["chunks"]:
            continue
        tid = triton_id(req["id"])
        # the first response with tokens (a held character can make it more than one), and the delta
        # that completed it
        reply = (joined.gateway.get(tid) or [{}])[0]
        rid, points = joined.token(tid, reply, req["chunks"][0])
        start = joined.first.get(rid) or {}  # the first delta: when the engine core queued and scheduled it
        # the `request` hop's records: the gateway's call, the stub's execute(), the hand-over to the engine
        for point, at in (("call", "gateway"), ("execute", "stub"), ("submit", "submit")):
            points[point] = (joined.request.get((at, tid)) or {}).get("t")
        points |= {
            "sent": req["sent"],
            "got": (joined.got.get(rid) or {}).get("t"),
            "queued": start.get("queued_ts"),
            "scheduled": start.get("scheduled_ts"),
        }
        for name, a, b in PATH:
            if points[a] is not None and points[b] is not None:
                spent[name].append((points[b] - points[a]) * 1000)
    return spent


def trace_table(levels: list[int], spent: dict[int, dict[str, list[float]]], mean: bool = False) -> str:
    """Per hop, the median (p90) milliseconds a token spent in it at each concurrency; with `mean`, the
    mean (p90): means add up along a path (the steps' means sum to the TTFT's), medians do not."""
    head = " | ".join(f"c={c} {'mean' if mean else 'p50'} (p90) ms" for c in levels)
    lines = [f"| hop | {head} |", "|---" * (len(levels) + 1) + "|"]
    for name in spent[levels[0]]:
        cells = []
        for c in levels:
            vals = sorted(spent[c][name])
            if not vals:
                cells.append("-")
                continue
            p90 = vals[min(len(vals) - 1, int(0.9 * len(vals)))]
            middle = statistics.fmean(vals) if mean else statistics.median(vals)
            cells.append(f"{middle:.2f} ({p90:.2f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
