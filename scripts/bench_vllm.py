"""LPX's vllm target through its gateway against vLLM's own OpenAI server on the same build folder, and
against LPX's torch target, on this machine, in one run (issue 26 item 5; docs/vllm.md has the figures).

The three servers run side by side (one at a time would put minutes of machine drift between them); the
measurement alternates: each round runs `lpx bench --api openai --endpoint completions` on each server in
turn, the order reversed every other round, and the table takes each level's median over rounds of TTFT
p50 / p99, ITL p50, output tok/s and req/s. vLLM's own server gets the build's engine arguments and the
same tcmalloc / Intel OpenMP preloads as LPX's worker.

    make setup vllm
    .venv/bin/python scripts/bench_vllm.py --out docs/results/vllm-cpu --rounds 3

With `--aiperf PATH` (NVIDIA's AIPerf, `pip install aiperf==0.13.0` in a venv of its own: its
dependencies are not LPX's), each round also runs `aiperf profile` at each level on each server, the same
input / output lengths (output forced with `--extra-inputs ignore_eos:true`, counted by the server), and
the table gets an AIPerf block beside `lpx bench`'s.

`--checkpoint DIR` measures another Hugging Face checkpoint instead of the demo's tiny model (the
real-model example's, say). `--trace` starts LPX's servers with LPX_TRACE (pipeline/trace.py) and, after
the rounds, sends streamed completions at each level and prints where the median token spent its time in
each hop (engine core -> vLLM worker -> the stub's reader -> the request's thread -> Triton's sender ->
the gateway -> the client), then each request's own path to its first token (the gateway's gRPC call,
the stub's execute(), vLLM's worker, its engine core's queue and prefill, the first token's hops) in
means, which add up to the TTFT; with vllm-own among the servers, the same requests to vLLM's own server
beside it, split by its /metrics histograms (its front end's TTFT, queue and prefill).
`--trace-requests N` sets the streamed requests a level (default 2 x c, 4 at least); `--no-bench` skips
the rounds, `--servers` picks the servers. `--pin 1`
binds LPX's own hops (gateway, tritonserver, its python stubs) to CPU 1 once the servers are up, off the
core vLLM binds its compute threads to (VLLM_CPU_OMP_THREADS_BIND=auto: core 0 of 2), to see what the
machine's sharing costs LPX's path.

    .venv/bin/python scripts/bench_vllm.py --out /tmp/trace --trace --no-bench --servers lpx-vllm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
LPX = ROOT / ".venv" / "bin" / "lpx"
METRICS = (("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(work: Path, checkpoint: Path, target: str, port: int) -> Path:
    from pipeline.demo import demo_config_dict

    data = demo_config_dict(str(checkpoint))
    data["model"]["name"] = checkpoint.name.lower().replace("_", "-")
    data["variants"] = [{"name": "bf16", "quantization": {"format": "none"}}]
    data["build"]["target"] = target
    data["serving"].update(ready_timeout_s=900, openai={"port": port})
    path = work / f"{target}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited ({proc.returncode})")
        try:
            opener.open(f"{url}/v1/models", timeout=5).read()
            return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"{url}: not ready after {timeout_s:.0f} s")


HOPS = (  # (name, from, to): the trace's points in the order a token passes them
    ("engine core -> worker sent", "core", "worker"),
    ("worker -> stub's reader", "worker", "reader"),
    ("reader -> request thread", "reader", "taken"),
    ("request thread -> Triton send", "taken", "stub"),
    ("Triton send -> gateway got", "stub", "gateway"),
    ("gateway got -> client got", "gateway", "client"),
)


def traced_requests(url: str, c: int, n: int, prompt: str, max_tokens: int) -> list[dict]:
    """`n` streamed completions, `c` at a time: per request its response id and each chunk's receipt
    (CLOCK_MONOTONIC, the trace's clock)."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit

    host = urlsplit(url)
    model = served_model(url)
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    )

    def one(_: int) -> dict:
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
        sent = time.monotonic()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        rid, chunks = None, []
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            rid = rid or doc.get("id")
            if any(choice.get("text") for choice in doc.get("choices", [])):
                chunks.append(time.monotonic())
        conn.close()
        return {"id": rid, "sent": sent, "chunks": chunks}

    with ThreadPoolExecutor(c) as pool:
        return list(pool.map(one, range(n)))


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


def vllm_own_path(url: str, levels: str, prompt: str, n: int = 0) -> str:
    """vLLM's own server, the same streamed requests: the client's TTFT against what vLLM's metrics say of
    its engine (means of the /metrics histograms over each level: its front end's TTFT, from the request's
    arrival in its API server to the first token's output there; queue and prefill times in its engine
    core), so the front end's share of TTFT is the difference."""
    names = {
        "ttft": "vllm:time_to_first_token_seconds",
        "queue": "vllm:request_queue_time_seconds",
        "prefill": "vllm:request_prefill_time_seconds",
    }

    def scrape() -> dict[str, tuple[float, float]]:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        text = opener.open(f"{url}/metrics", timeout=30).read().decode()
        totals: dict[str, float] = {}  # series name (labels dropped) -> its value summed over labels
        for line in text.splitlines():
            if line.startswith("vllm:"):
                series, _, value = line.rpartition(" ")
                name = series.split("{", 1)[0]
                totals[name] = totals.get(name, 0.0) + float(value)
        return {
            key: (totals.get(f"{name}_sum", 0.0), totals.get(f"{name}_count", 0.0))
            for key, name in names.items()
        }

    wanted = [int(x) for x in levels.split(",")]
    traced_requests(url, 1, 2, prompt, 8)  # warm-up
    lines = ["| mean ms | " + " | ".join(f"c={c}" for c in wanted) + " |", "|---" * (len(wanted) + 1) + "|"]
    cells: dict[str, list[str]] = {k: [] for k in ("client", "ttft", "front", "queue", "prefill", "rest")}
    for c in wanted:
        before = scrape()
        done = traced_requests(url, c, n or max(2 * c, 4), prompt, 64)
        after = scrape()
        mean = {}
        for key in names:
            count = after[key][1] - before[key][1]
            mean[key] = (after[key][0] - before[key][0]) / count * 1000 if count else float("nan")
        ttfts = [(r["chunks"][0] - r["sent"]) * 1000 for r in done if r["chunks"]]
        client = statistics.fmean(ttfts) if ttfts else float("nan")
        values = {
            "client": client,
            "ttft": mean["ttft"],
            "front": client - mean["ttft"],
            "queue": mean["queue"],
            "prefill": mean["prefill"],
            "rest": mean["ttft"] - mean["queue"] - mean["prefill"],
        }
        for key, value in values.items():
            cells[key].append(f"{value:.2f}")
    labels = {
        "client": "TTFT (client)",
        "ttft": "vLLM's TTFT (API server: arrival -> first token)",
        "front": "client - vLLM's TTFT (HTTP, its front end before arrival, SSE)",
        "queue": "queued -> scheduled",
        "prefill": "scheduled -> first token (prefill)",
        "rest": "vLLM's TTFT - queue - prefill (API server <-> engine core)",
    }
    for key, label in labels.items():
        lines.append(f"| {label} | " + " | ".join(cells[key]) + " |")
    return "\n".join(lines)


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


def trace_run(url: str, folder: Path, levels: str, prompt: str, n: int = 0) -> str:
    from pipeline import trace

    spent, path = {}, {}
    wanted = [int(x) for x in levels.split(",")]
    traced_requests(url, 1, 2, prompt, 8)  # warm-up
    for c in wanted:
        done = traced_requests(url, c, n or max(2 * c, 4), prompt, 64)
        time.sleep(0.5)  # the hops' last lines reach their files
        records = trace.read(folder)
        spent[c], path[c] = timeline(records, done), request_path(records, done)
    return (
        trace_table(wanted, spent)
        + "\n\nThe request's path to its first token:\n\n"
        + trace_table(wanted, path, mean=True)
    )


def start_lpx(cfg: Path, port: int, log: Path, env: dict) -> tuple[str, subprocess.Popen]:
    subprocess.run([str(LPX), "repo", "-c", str(cfg)], check=True, env=env)
    proc = subprocess.Popen(
        [str(LPX), "serve", "-c", str(cfg)], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env
    )
    return f"http://127.0.0.1:{port}", proc


def start_vllm_own(env: dict, log: Path) -> tuple[str, subprocess.Popen]:
    from pipeline.artifacts import Store  # noqa: F401 - the LPX_HOME in env is the one searched below
    from pipeline.runtime.engines import vllm_engine
    from pipeline.stages.build.vllm_target import serve_command

    builds = sorted(Path(env["LPX_HOME"]).glob(f"artifacts/engines/*/bf16/*/*/{vllm_engine.MODEL_FILE}"))
    folder = builds[-1].parent
    python = vllm_engine.find_python()
    port = free_port()
    argv = [python, *serve_command(folder, port=port), "--served-model-name", "vllm-own"]
    proc = subprocess.Popen(
        argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=vllm_engine.worker_env(python)
    )
    return f"http://127.0.0.1:{port}", proc


def bench(url: str, out: Path, levels: str, requests: int, env: dict, tokenizer: Path) -> dict:
    argv = [str(LPX), "bench", "--api", "openai", "--endpoint", "completions", "--url", url]
    argv += ["--concurrency", levels, "--requests", str(requests), "--warmup", "2", "--out", str(out)]
    argv += ["--input-len", "128", "--output-len", "64", "--tokenizer", str(tokenizer)]
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def served_model(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return json.loads(opener.open(f"{url}/v1/models", timeout=30).read())["data"][0]["id"]


def aiperf(exe: str, url: str, out: Path, levels: str, requests: int, tokenizer: Path) -> dict:
    """AIPerf at each level: a results.json of the shape `row` reads (its profile_export_aiperf.json
    figures: time_to_first_token / inter_token_latency p50, p99 in ms, output_token_throughput and
    request_throughput averages)."""
    results = []
    for c in [int(x) for x in levels.split(",")]:
        art = out / f"c{c}"
        argv = [exe, "profile", "-m", served_model(url), "--url", url, "--endpoint-type", "completions"]
        argv += ["--streaming", "--tokenizer", str(tokenizer), "--isl", "128", "--osl", "64"]
        argv += ["--request-count", str(requests), "--concurrency", str(c), "--warmup-request-count", "2"]
        argv += ["--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--ui-type", "none"]
        argv += ["--artifact-dir", str(art)]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        doc = json.loads(next(art.rglob("profile_export_aiperf.json")).read_text())
        for tag in ("time_to_first_token", "inter_token_latency"):
            if doc[tag].get("unit") != "ms":
                raise SystemExit(f"AIPerf reported {tag} in {doc[tag].get('unit')}, not ms")
        results.append(
            {
                "load": {"concurrency": c},
                "ttft_ms": doc["time_to_first_token"],
                "itl_ms": doc["inter_token_latency"],
                "output_tokens_per_s": doc["output_token_throughput"]["avg"],
                "requests_per_s": doc["request_throughput"]["avg"],
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"results": results}, indent=1))
    return {"results": results}


def role(proc) -> str:
    """What a process of a server's tree is, for the CPU table."""
    try:
        name, cmd = proc.name(), " ".join(proc.cmdline())
    except Exception:  # it ended meanwhile
        return "ended"
    if "tritonserver" in name:
        return "tritonserver"
    if "triton_python_backend_stub" in cmd:
        return "python stubs"
    if "vllm_worker.py" in cmd or "EngineCore" in name or "EngineCore" in cmd:
        return "vLLM engine"
    if "api_server" in cmd:
        return "vLLM API server"
    if "gateway" in cmd:
        return "gateway"
    return "other (lpx serve; vLLM's engine-core children)"


def cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of a server's process tree, by role."""
    import psutil

    out: dict[str, float] = {}
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for proc in tree:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        key = role(proc)
        out[key] = out.get(key, 0.0) + t.user + t.system
    return out


def pin_hops(pid: int, cpus: set[int]) -> list[str]:
    """Bind every thread of LPX's own hops in a server's tree (lpx serve, the gateway, tritonserver, its
    python stubs) to `cpus`, leaving vLLM's processes (the worker and all it started) where vLLM put
    them; threads started later inherit the binding. What was pinned, as "role pid", then where vLLM's
    processes' threads are."""
    import psutil

    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    vllm: set[int] = set()
    for proc in tree:
        if "vllm_worker.py" in " ".join(proc.cmdline()):
            vllm |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
    pinned, left = [], []
    for proc in tree:
        tasks = [int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir()]
        on = set()
        for task in tasks:
            try:
                if proc.pid in vllm:
                    on.add(tuple(sorted(os.sched_getaffinity(task))))
                else:
                    os.sched_setaffinity(task, cpus)
            except (ProcessLookupError, PermissionError):
                continue  # the thread ended meanwhile
        if proc.pid in vllm:
            left.append(f"vLLM {proc.pid} threads on {sorted(on)}")
            continue
        pinned.append(f"{role(proc)} {proc.pid}")
    return pinned + left


def cpu_table(cpu: dict[str, list[dict]]) -> str:
    """Per server, the CPU its tree spent per output token while it was measured (median over rounds), by
    role, and what the idle servers spent meanwhile."""
    lines = [
        "| server | CPU ms per output token, by process | idle servers' CPU s during its runs |",
        "|---|---|---|",
    ]
    for name, runs in cpu.items():
        roles = sorted({k for r in runs for k in r["own"]})
        own = ", ".join(
            f"{k} {statistics.median(r['own'].get(k, 0.0) for r in runs) * 1000 / runs[0]['tokens']:.2f}"
            for k in roles
        )
        total = statistics.median(sum(r["own"].values()) for r in runs) * 1000 / runs[0]["tokens"]
        idle = statistics.median(r["idle"] for r in runs)
        lines.append(f"| {name} | **{total:.2f}**: {own} | {idle:.1f} |")
    return "\n".join(lines)


def row(doc: dict) -> dict[int, dict[str, float]]:
    """concurrency -> the figures of one bench run (results.json's `results`, one per level)."""
    out = {}
    for r in doc["results"]:
        figures = {f"{m}_{q}": (r.get(f"{m}_ms") or {}).get(q) for m, q in METRICS}
        figures["tok_s"] = r["output_tokens_per_s"]
        figures["req_s"] = r["requests_per_s"]
        out[int(r["load"]["concurrency"])] = figures
    return out


def table(results: dict[str, list[dict]]) -> str:
    lines = [
        "| server | c | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | tok/s | req/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        rows = [row(r) for r in runs]
        for c in sorted(rows[0]):
            med = {}
            for key in rows[0][c]:
                vals = [r[c][key] for r in rows if c in r and r[c][key] is not None]
                med[key] = statistics.median(vals) if vals else float("nan")
            ms = {k: med[k] for k in med if k.startswith(("ttft", "itl"))}
            lines.append(
                f"| {name} | {c} | {ms['ttft_p50']:.1f} | {ms['ttft_p99']:.1f} | {ms['itl_p50']:.1f} | "
                f"{med['tok_s']:.0f} | {med['req_s']:.2f} |"
            )
    return "\n".join(lines)


def _cpu_range(part: str) -> range:
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--aiperf", help="AIPerf's executable: also measure every server with it")
    ap.add_argument(
        "--checkpoint", type=Path, help="a Hugging Face checkpoint (default: the demo's tiny one)"
    )
    ap.add_argument("--trace", action="store_true", help="the per-hop timeline of LPX's servers (LPX_TRACE)")
    ap.add_argument(
        "--trace-requests",
        type=int,
        default=0,
        help="streamed requests a level for --trace (default 2 x c, 4 at least)",
    )
    ap.add_argument(
        "--no-bench", action="store_true", help="skip the rounds (with --trace: the timeline only)"
    )
    ap.add_argument("--servers", default="lpx-vllm,lpx-torch,vllm-own", help="which servers to start")
    ap.add_argument(
        "--pin",
        help="CPUs (e.g. 1 or 1-3) to bind LPX's own hops to once the servers are up: the gateway, "
        "tritonserver and its stubs, not vLLM's processes (vLLM binds its compute threads itself)",
    )
    args = ap.parse_args()
    pin = None
    if args.pin:
        try:
            pin = {c for part in args.pin.split(",") for c in _cpu_range(part)}
        except ValueError:
            raise SystemExit(f"--pin {args.pin}: give CPU numbers, e.g. 1 or 1-3 or 0,2") from None
        if not pin <= os.sched_getaffinity(0):
            raise SystemExit(f"--pin {args.pin}: this machine's CPUs are {sorted(os.sched_getaffinity(0))}")
    chosen = set(args.servers.split(","))
    if not chosen <= {"lpx-vllm", "lpx-torch", "vllm-own"}:
        raise SystemExit(f"--servers: {args.servers} - choose among lpx-vllm, lpx-torch, vllm-own")
    sys.path.insert(0, str(ROOT))
    from pipeline.demo import write_checkpoint

    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LPX_HOME": str(work / "home")}
    checkpoint = args.checkpoint.resolve() if args.checkpoint else work / "checkpoint"
    if not checkpoint.is_dir():
        if args.checkpoint:
            raise SystemExit(f"--checkpoint {checkpoint}: no such folder")
        write_checkpoint(checkpoint)
    procs, servers, traces = [], {}, {}
    try:
        for target in ("vllm", "torch"):
            if f"lpx-{target}" not in chosen and not (target == "vllm" and "vllm-own" in chosen):
                continue
            port = free_port()
            served_env = dict(env)
            if args.trace:
                traces[f"lpx-{target}"] = work / "trace" / target
                shutil.rmtree(traces[f"lpx-{target}"], ignore_errors=True)
                served_env["LPX_TRACE"] = str(traces[f"lpx-{target}"])
            cfg = config(work, checkpoint, target, port)
            if f"lpx-{target}" not in chosen:  # vLLM's own server needs the vllm build only
                subprocess.run([str(LPX), "build", "-c", str(cfg)], check=True, env=env)
                continue
            url, proc = start_lpx(cfg, port, work / f"{target}.log", served_env)
            procs.append(proc)
            wait_ready(url, proc)
            servers[f"lpx-{target}"] = url
        if "vllm-own" in chosen:
            url, proc = start_vllm_own(env, work / "vllm-own.log")
            procs.append(proc)
            wait_ready(url, proc)
            servers["vllm-own"] = url
        pids = {name: p.pid for name, p in zip(servers, procs, strict=True)}
        if pin is not None:
            for name, pid in pids.items():
                if name.startswith("lpx-"):
                    print(
                        f"{name}: pinned to CPUs {sorted(pin)}: {', '.join(pin_hops(pid, pin))}", flush=True
                    )
        cpu: dict[str, list[dict]] = {name: [] for name in servers}
        results: dict[str, list[dict]] = {name: [] for name in servers}
        for r in range(0 if args.no_bench else args.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:
                out = work / "runs" / f"{r}-{name}"
                before = {n: cpu_s(pid) for n, pid in pids.items()}
                results[name].append(bench(servers[name], out, args.levels, args.requests, env, checkpoint))
                after = {n: cpu_s(pid) for n, pid in pids.items()}
                used = {n: {k: v - before[n].get(k, 0.0) for k, v in after[n].items()} for n in pids}
                runs = results[name][-1]["results"]  # the warm-up requests ran too, as long
                tokens = sum((r["succeeded"] + r["load"]["warmup"]) * r["osl"]["mean"] for r in runs)
                idle = sum(sum(u.values()) for n, u in used.items() if n != name)
                cpu[name].append({"own": used[name], "tokens": tokens, "idle": idle})
                if args.aiperf:
                    tool = work / "runs" / f"{r}-{name}-aiperf"
                    doc = aiperf(args.aiperf, servers[name], tool, args.levels, args.requests, checkpoint)
                    results.setdefault(f"{name} (AIPerf)", []).append(doc)
        text = "" if args.no_bench else table(results) + "\n\n" + cpu_table(cpu)
        prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)
        for name, folder in traces.items():
            text += f"\n\n{name}: where a token waits (LPX_TRACE)\n\n"
            text += trace_run(servers[name], folder, args.levels, prompt, args.trace_requests)
        if args.trace and "vllm-own" in servers:
            text += "\n\nvllm-own: the request's path to its first token (vLLM's /metrics)\n\n"
            text += vllm_own_path(servers["vllm-own"], args.levels, prompt, args.trace_requests)
        (work / "table.md").write_text(text + "\n")
        print(text)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work / "home" / "tmp", ignore_errors=True)


if __name__ == "__main__":
    main()
