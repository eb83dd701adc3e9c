"""scripts/bench_repo.py's measurements of LPX's Triton repository on a real server (the torch target, the
demo's tiny model): (a) the per-request overhead of `ensemble` and `tensorrt_llm_bls` over a direct streamed
call to `tensorrt_llm`; (b) postprocessing's CPU time per streamed token at 16, 256 and 1024 output tokens,
from Triton's metrics (the script's docstring says how).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .server_metrics import triton_model_counters

PROMPT = "Bread is made from flour, water and salt, and"
LENGTHS = (16, 256, 1024)
REPEATS = {16: 8, 256: 3, 1024: 2}  # requests per length in (b), summed


def end_id(engine: Path) -> int:
    """The pad id (a special token greedy decoding of the demo model does not produce, unlike its last
    vocabulary id, seen at token 160); part (b) checks that every request ran to its max_tokens."""
    conf = json.loads((engine / "config.json").read_text())
    return int(conf.get("pad_token_id") if conf.get("pad_token_id") is not None else conf["vocab_size"] - 1)


def build_repo(work: Path, fmt: str) -> tuple[Path, Path]:
    """Demo checkpoint -> torch engine (max_seq_len 2048) -> repository with max_tokens_cap 1024+."""
    from ..config import parse_config
    from ..demo import demo_config_dict, write_checkpoint
    from ..stages.repository import write_repository
    from .engine_bench import build_engine

    built = build_engine(
        write_checkpoint(work / "checkpoint"),
        work / "home",
        fmt,
        max_batch_size=8,
        max_input_len=512,
        max_seq_len=2048,
        max_num_tokens=4096,
    )
    engine = work / "engine"  # a copy: its config files are edited below
    shutil.copytree(built, engine)
    # the engine always ends on generation_config's EOS too: make it an id the model does not produce,
    # so that every request runs to its max_tokens (the tiny model says EOS after ~60 tokens)
    never = end_id(engine)
    for name in ("config.json", "generation_config.json"):
        path = engine / name
        if path.is_file():
            conf = json.loads(path.read_text())
            conf["eos_token_id"] = never
            path.write_text(json.dumps(conf, indent=2) + "\n")
    d = demo_config_dict(str(work / "checkpoint"))
    d["build"] = {**d["build"], "max_seq_len": 2048, "max_input_len": 512}
    d["serving"] = {**d["serving"], "max_tokens_cap": 1100}
    write_repository(work / "repo", engine, parse_config(d))
    return work / "repo", engine


class Streamer:
    """One open gRPC stream; `run` sends one request and waits for its final response."""

    def __init__(self, url: str) -> None:
        import tritonclient.grpc as grpcclient

        self.grpc = grpcclient
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))
        self.n = 0

    def tensors(self, arrays: dict[str, np.ndarray]) -> list:
        kinds = {np.dtype(object): "BYTES", np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL"}
        out = []
        for name, arr in arrays.items():
            out.append(self.grpc.InferInput(name, list(arr.shape), kinds[arr.dtype]))
            out[-1].set_data_from_numpy(arr)
        return out

    def run(self, model: str, inputs: list) -> tuple[float, int]:
        """(seconds to the final response, responses with data); self.tokens: tokens in them (engine only)."""
        self.tokens = 0
        self.n += 1
        rid = str(self.n)
        t0 = time.perf_counter()
        # a model may send FINAL as a separate empty response: ask for it, or the stream never ends
        self.client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)
        responses = 0
        while True:
            result, error = self.results.get(timeout=300)
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            resp = result.get_response()
            if resp.outputs:
                responses += 1
                if model == "tensorrt_llm":
                    self.tokens += int(result.as_numpy("sequence_length").sum())
            if resp.parameters["triton_final_response"].bool_param:
                return time.perf_counter() - t0, responses

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def text_inputs(s: Streamer, n: int, never: int) -> list:
    """The text models' request (ensemble, tensorrt_llm_bls): PROMPT, `n` tokens, streamed."""
    return s.tensors(
        {
            "text_input": np.array([[PROMPT.encode()]], dtype=object),
            "max_tokens": np.array([[n]], np.int32),
            "end_id": np.array([[never]], np.int32),
            "stream": np.array([[True]]),
        }
    )


def engine_inputs(s: Streamer, ids: list[int], n: int, never: int) -> list:
    """The direct `tensorrt_llm` request of the same token ids, `n` tokens, streamed."""
    return s.tensors(
        {
            "input_ids": np.array([ids], np.int32),
            "input_lengths": np.array([[len(ids)]], np.int32),
            "request_output_len": np.array([[n]], np.int32),
            "end_id": np.array([[never]], np.int32),
            "streaming": np.array([[True]]),
        }
    )


def run(args: argparse.Namespace) -> int:
    """Build the engine and repository, serve them, measure (a) and (b), print and write the figures."""
    from transformers import AutoTokenizer

    from ..servers.tritonserver import TritonServer

    work = args.work or Path(tempfile.mkdtemp(prefix="lpx-bench-repo-"))
    os.environ.setdefault("LPX_HOME", str(work / "home"))
    t0 = time.perf_counter()
    repo, engine = build_repo(work, args.format)
    print(f"engine + repository built in {time.perf_counter() - t0:.1f} s: {repo}")
    tok = AutoTokenizer.from_pretrained(engine)
    ids = tok(PROMPT)["input_ids"]  # preprocessing adds special tokens too (add_special_tokens: true)
    never = end_id(engine)
    report: dict = {
        "prompt_tokens": len(ids),
        "format": args.format,
        "requests": args.requests,
        "warmup": args.warmup,
        "output_tokens": args.tokens,
        "end_id": never,
    }
    with TritonServer(repo, log_path=work / "triton.log", ready_timeout_s=300) as srv:
        report["models"] = models = ready_models(srv.grpc_url)
        print(f"server ready (gRPC {srv.grpc_url}, metrics {srv.metrics_url}); models: {', '.join(models)}")
        s = Streamer(srv.grpc_url)
        report["overhead"] = rows = overhead(s, models, ids, never, args, report)
        print_overhead(rows, args)
        report["postprocessing"] = post = postprocessing(s, srv.metrics_url, ids, never)
        s.close()
    print_postprocessing(post, never)
    report["postprocessing_flat_ratio"] = flat_ratio(post)
    print(f"largest / 16-token compute per token: {report['postprocessing_flat_ratio']:.2f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


def ready_models(grpc_url: str) -> list[str]:
    import tritonclient.grpc as grpcclient

    admin = grpcclient.InferenceServerClient(grpc_url)
    models = sorted(m.name for m in admin.get_model_repository_index().models if admin.is_model_ready(m.name))
    admin.close()
    return models


def overhead(s: Streamer, models: list[str], ids: list[int], never: int, args, report: dict) -> dict:
    """(a): the models in turn each round (drift hits all alike), warm-up excluded; a model that fails is
    dropped, its error kept in report["errors"]. The rows of overhead_rows."""
    subjects = {"tensorrt_llm": engine_inputs(s, ids, args.tokens, never)}
    subjects["ensemble"] = text_inputs(s, args.tokens, never)
    if "tensorrt_llm_bls" in models:
        subjects["tensorrt_llm_bls"] = text_inputs(s, args.tokens, never)
    lat: dict[str, list[float]] = {m: [] for m in subjects}
    chunks: dict[str, int] = {}
    for i in range(args.warmup + args.requests):
        for model, inputs in subjects.items():
            try:
                dt, n = s.run(model, inputs)
            except RuntimeError as exc:
                lat[model], chunks[model] = [], -1
                report.setdefault("errors", {})[model] = str(exc)
                continue
            if i >= args.warmup and chunks.get(model, 0) >= 0:
                lat[model].append(dt)
                chunks[model] = n
        subjects = {m: v for m, v in subjects.items() if chunks.get(m, 0) >= 0}
    return overhead_rows(lat, chunks)


def overhead_rows(lat: dict[str, list[float]], chunks: dict[str, int]) -> dict[str, dict]:
    """model -> median and p90 latency (ms) of its requests (`lat`, seconds), what each adds over the direct
    `tensorrt_llm` call's, and the responses with data of its last request (`chunks`)."""
    base = statistics.median(lat["tensorrt_llm"])
    rows = {}
    for model, xs in lat.items():
        if not xs:
            continue
        med, p90 = statistics.median(xs), pct(xs, 0.9)
        rows[model] = {
            "median_ms": med * 1e3,
            "p90_ms": p90 * 1e3,
            "overhead_median_ms": (med - base) * 1e3,
            "overhead_p90_ms": (p90 - pct(lat["tensorrt_llm"], 0.9)) * 1e3,
            "responses": chunks[model],
            "n": len(xs),
        }
    return rows


def print_overhead(rows: dict[str, dict], args) -> None:
    print(
        f"\n(a) {args.requests} sequential streamed requests of {args.tokens} tokens, "
        f"{args.warmup} warm-up excluded"
    )
    print(f"{'model':<18}{'median ms':>10}{'p90 ms':>9}{'+median ms':>12}{'+p90 ms':>9}{'responses':>11}")
    for model, r in rows.items():
        print(
            f"{model:<18}{r['median_ms']:>10.2f}{r['p90_ms']:>9.2f}{r['overhead_median_ms']:>12.2f}"
            f"{r['overhead_p90_ms']:>9.2f}{r['responses']:>11}"
        )


def postprocessing(s: Streamer, metrics_url: str, ids: list[int], never: int) -> list[dict]:
    """(b): per length, the engine's tokens for the prompt (greedy: the same tokens the ensemble will
    decode), then REPEATS[n] ensemble requests between two reads of postprocessing's counters."""
    post = []
    for n in LENGTHS:
        s.run("tensorrt_llm", engine_inputs(s, ids, n, never))
        tokens = s.tokens
        reps = REPEATS[n]
        before = triton_model_counters(metrics_url, "postprocessing")
        dt = responses = 0
        for _ in range(reps):
            one_dt, one_n = s.run("ensemble", text_inputs(s, n, never))
            dt, responses = dt + one_dt / reps, responses + one_n
        time.sleep(0.2)
        after = triton_model_counters(metrics_url, "postprocessing")
        post.append(post_row(n, tokens * reps, reps, responses, dt, before, after))
    return post


def post_row(n: int, tokens: int, reps: int, responses: int, dt: float, before: dict, after: dict) -> dict:
    """One length's figures from postprocessing's counters read before and after its `reps` requests
    (`tokens` in all, `dt` seconds a request on average)."""
    d = {k: after[k] - before[k] for k in after}
    calls = d["nv_inference_request_success"] or 1
    return {
        "max_tokens": n,
        "tokens": tokens,
        "responses": responses,
        "postprocessing_calls": int(calls),
        "compute_us_per_token": d["nv_inference_compute_infer_duration_us"] / tokens,
        "request_us_per_token": d["nv_inference_request_duration_us"] / tokens,
        "compute_us_per_call": d["nv_inference_compute_infer_duration_us"] / calls,
        "requests": reps,
        "stream_s": dt,
        "tokens_per_s": tokens / reps / dt,
    }


def print_postprocessing(post: list[dict], never: int) -> None:
    print(
        "\n(b) postprocessing per streamed token (Triton metrics, model postprocessing; tokens and calls "
        "summed over the requests; a call decodes one streamed delta, which may hold several tokens)"
    )
    print(
        f"{'max_tok':>7}{'tokens':>7}{'calls':>7}{'compute us/tok':>16}{'request us/tok':>16}{'us/call':>9}{'tok/s':>8}"
    )
    for r in post:
        print(
            f"{r['max_tokens']:>7}{r['tokens']:>7}{r['postprocessing_calls']:>7}{r['compute_us_per_token']:>16.1f}"
            f"{r['request_us_per_token']:>16.1f}{r['compute_us_per_call']:>9.1f}{r['tokens_per_s']:>8.1f}"
        )
    short = [r["max_tokens"] for r in post if r["tokens"] != r["max_tokens"] * r["requests"]]
    if short:
        print(f"warning: requests for {short} tokens ended early (the model produced end_id {never})")


def flat_ratio(post: list[dict]) -> float | None:
    """The largest compute time per token over the 16-token one's: 1 when postprocessing is O(1) a token."""
    per = [r["compute_us_per_token"] for r in post]
    return max(per[1:]) / per[0] if per[0] else None
