"""The vllm target's engine: vLLM's AsyncLLM over a vllm build folder (pipeline/stages/build/vllm_target.py),
with the same `submit` as TorchEngine and LlmApiEngine, so LPX's Triton model (engine_model.py) serves it.

vLLM cannot run in the process of LPX's Triton model: the stub imports LPX's environment, whose
transformers (pinned below 5.15 by ModelOpt) is not the one vLLM 0.32 needs (>= 5.16.1). So AsyncLLM runs
in a child process started with vLLM's environment's python (vllm_worker.py, which imports nothing of
LPX), and this class speaks JSON lines with it: requests on its stdin, token deltas back on a pipe of
their own. Token ids in, token ids out: LPX's pre/postprocessing own the tokenizer. Cancelling aborts
the request in vLLM. docs/vllm.md has the design and its measured cost.

vLLM's python: $LPX_VLLM_PYTHON, else the checkout's .venv-vllm (made by `make vllm`), else the first
`python3` on PATH that imports vllm (vLLM's own image).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ... import trace
from ...errors import LpxError
from .base import DONE, ENGINE_OPTIONS, DeltaStream, Engine, Request, greedy
from .guides import OPTIONS as GUIDE_OPTIONS
from .guides import ebnf, requested

MODEL_FILE = "lpx_vllm.json"  # model (the checkpoint folder), engine_args, and what LPX checks
PYTHON_VARIABLE = "LPX_VLLM_PYTHON"
VENV = ".venv-vllm"
WORKER = Path(__file__).with_name("vllm_worker.py")
READY_TIMEOUT_S = 900.0  # vLLM's start on 2 CPU cores under load: imports, weights, KV cache, compile
CLOSE_TIMEOUT_S = 20.0
# Preloaded into vLLM's process when present (vLLM's CPU start-up asks for both; docs/vllm.md has the gain)
PRELOADS = ("lib/libiomp5.so",)
TCMALLOC = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", ".tools/tcmalloc/libtcmalloc_minimal.so.4")


def read_build(folder: Path) -> dict:
    """lpx_vllm.json of a vllm build folder, with a clear error when it is not one."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / MODEL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LpxError(
            f"{folder} is not a vllm build folder ({exc}) - rebuild it with 'lpx build' (build.target: vllm)"
        ) from None
    if (
        not isinstance(meta, dict)
        or not isinstance(meta.get("engine_args"), dict)
        or not (folder / str(meta.get("model", ""))).is_dir()
    ):
        raise LpxError(
            f"{folder}/{MODEL_FILE} does not name a checkpoint folder and engine arguments - rebuild it "
            "with 'lpx build' (build.target: vllm)"
        )
    return meta


def vocab_size(checkpoint: Path) -> int:
    """The checkpoint's vocabulary size (config.json, or its text_config): vLLM's worker dies on a token id
    outside it (an IndexError in the embedding ends its engine), so requests are checked against it first."""
    try:
        conf = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
        return int((conf.get("text_config") or conf)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LpxError(
            f"{checkpoint}/config.json has no vocab_size ({exc}) - rebuild it with 'lpx build' (build.target: vllm)"
        ) from None


def checkout_root() -> Path:
    """The folder holding the `pipeline` package (an editable install: the checkout)."""
    return Path(__file__).resolve().parents[3]


def find_python() -> str:
    """vLLM's python (see the module docstring), or a LpxError naming the fix."""
    given = os.environ.get(PYTHON_VARIABLE)
    if given:
        if not os.access(given, os.X_OK):
            raise LpxError(f"{PYTHON_VARIABLE}={given} is not an executable - point it at vLLM's python")
        return given
    venv = checkout_root() / VENV / "bin" / "python"
    if venv.is_file():
        return str(venv)
    found = shutil.which("python3")
    if found and _imports_vllm(found):
        return found
    raise LpxError(
        "build.target vllm needs vLLM's environment: run 'make vllm' in LPX's checkout (it makes "
        f"{VENV}), or set {PYTHON_VARIABLE} to the python of an environment with vLLM 0.32"
    )


def _imports_vllm(python: str) -> bool:
    probe = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"]
    return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0


def worker_env(python: str) -> dict[str, str]:
    """The worker's environment: this one, with tcmalloc and Intel OpenMP preloaded when present."""
    env = dict(os.environ)
    prefix = Path(python).parent.parent
    libs = [str(prefix / p) for p in PRELOADS if (prefix / p).is_file()]
    for candidate in TCMALLOC:
        path = Path(candidate) if candidate.startswith("/") else checkout_root() / candidate
        if path.is_file():
            libs.insert(0, str(path))
            break
    if libs:
        env["LD_PRELOAD"] = ":".join([*libs, *filter(None, [env.get("LD_PRELOAD")])])
    env.pop("PYTHONPATH", None)  # nothing of LPX's environment may shadow vLLM's packages
    return env


def sampling(request: Request) -> dict[str, Any]:
    """SamplingParams fields for a checked request (TensorRT-LLM's request semantics, base.greedy).
    A guide becomes vLLM's structured outputs as one grammar (guides.ebnf), the one the torch target
    enforces: vLLM's own JSON-schema path would allow free whitespace and xgrammar's length-bounded
    string rule (guides.py), so the same request would be held to a different language per target."""
    options = dict(request.options)
    guide = requested(options)
    for name in GUIDE_OPTIONS:
        options.pop(name, None)
    params: dict[str, Any] = {"max_tokens": request.max_new_tokens, "seed": request.seed}
    if guide is not None:
        params["structured_outputs"] = {"grammar": ebnf(*guide)}
    top = int(options.pop("top_log_probs_k", 0) or 0)
    if options.pop("return_log_probs", False):
        params["logprobs"] = top  # 0: the sampled token's log prob only; k: and the k best per token
    params.update(options)  # repetition / presence / frequency penalties, min_tokens: the same names
    if request.end_ids:
        params["stop_token_ids"] = list(request.end_ids)
    if greedy(request.temperature, request.top_k, request.top_p):
        params["temperature"] = 0.0
    else:
        params["temperature"] = float(request.temperature)
        params["top_k"] = int(request.top_k) if request.top_k > 0 else 0
        params["top_p"] = float(request.top_p) if 0 < request.top_p <= 1 else 1.0
    return params


class VllmEngine(Engine):
    """vLLM's AsyncLLM in its own process (vllm_worker.py); `submit` as TorchEngine's."""

    TARGET = "vllm"
    SUPPORTED = frozenset(ENGINE_OPTIONS) | frozenset(GUIDE_OPTIONS)
    QUICK_START = True  # start() writes one line to the worker (vLLM compiles a guide in its own process)

    def __init__(self, folder: Path, python: str | None = None) -> None:
        self.folder = Path(folder)
        self.meta = read_build(self.folder)
        self.max_input_len = int(self.meta.get("max_input_len") or 0)
        self.max_seq_len = int(self.meta["engine_args"].get("max_model_len") or 0)
        self.vocab_size = vocab_size(self.folder / str(self.meta["model"]))
        python = python or find_python()
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [python, str(WORKER), str(self.folder), str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=sys.stderr,
                pass_fds=(write_fd,),
                env=worker_env(python),
                # its own process group, so close() ends vLLM's engine-core and worker processes with it;
                # NOT its own session: with the kernel's autogroup scheduling a session is a scheduling
                # group, and a vLLM session whose worker is pinned to a core left this process's reader
                # off that core for a whole request (tokens arrived in one burst at the end, measured:
                # first token ~200 ms, then 63 tokens in 0.3 ms; in the same session: 5 ms, then ~1.6 ms
                # per token; docs/results/vllm-cpu-2026-12-04.md)
                process_group=0,
                text=True,
            )
        finally:
            os.close(write_fd)
        self._replies = os.fdopen(read_fd, encoding="utf-8")
        self._streams: dict[str, DeltaStream] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = threading.Event()
        self._last_stats: dict[str, Any] | None = None
        self._ready: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="lpx-vllm-reader", daemon=True)
        self._reader.start()
        self._wait_ready()

    def _wait_ready(self) -> None:
        try:
            first = self._ready.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            first = {"error": f"not ready after {READY_TIMEOUT_S:.0f} s"}
        if "ready" not in first:
            self.close()
            raise LpxError(
                f"vLLM did not start on {self.folder}: {first.get('error', 'its process ended')} - "
                "see the server log above for vLLM's own messages"
            )
        self.kv = first["ready"]

    def _read(self) -> None:
        """Thread: the worker's replies to their streams."""
        for line in self._replies:
            message = json.loads(line)
            if "stats" in message:
                self._last_stats = message["stats"]
            elif "id" in message:
                self._deliver(message)
            else:
                self._ready.put(message)
        self._ready.put({"error": f"its process ended (exit status {self.proc.poll()})"})
        self._closed.set()
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.queue.put(RuntimeError("the vLLM engine process ended - restart the server"))

    def _deliver(self, message: dict) -> None:
        with self._lock:
            stream = self._streams.get(message["id"])
            if stream is not None and (message.get("d") or "error" in message):
                del self._streams[message["id"]]
        if stream is None:  # cancelled: late replies are dropped
            return
        if "error" in message:
            stream.queue.put(RuntimeError(f"generation failed: {message['error']}"))
            return
        # stream.result: everything generated so far, its log probs and alternatives (the worker sends deltas)
        tokens, logprobs, top = stream.result or ([], [], [])
        tokens, logprobs = tokens + message["t"], logprobs + message.get("lp", [])
        if trace.ON:  # the reader thread has the worker's line
            trace.mark("reader", id=message["id"], n=len(tokens))
        top = top + [(ids, values) for ids, values in message.get("top", [])]
        stream.result = tokens, logprobs, top
        item: tuple = (tokens, bool(message["d"]))
        if stream.logprobs is not None:
            item += (logprobs, top if stream.top is not None else None)
        stream.queue.put(item)

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message, separators=(",", ":")) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            raise LpxError("The vLLM engine process has ended - restart the server") from None

    def check_open(self) -> None:
        if self._closed.is_set():
            raise LpxError("The vllm engine is closed - restart the server")

    def start(self, request: Request) -> DeltaStream:
        bad = [t for t in request.input_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise LpxError(f"Token ids outside the vocabulary (size {self.vocab_size}): {bad[:5]}")
        stream = DeltaStream(f"lpx-{next(self._ids)}", self.cancel)
        params = sampling(request)
        if "logprobs" in params:
            stream.logprobs = []
            if params["logprobs"]:
                stream.top = []
        with self._lock:
            self._streams[stream.request_id] = stream
        try:
            self._send({"op": "add", "id": stream.request_id, "ids": request.input_ids, "params": params})
        except LpxError:
            with self._lock:
                self._streams.pop(stream.request_id, None)
            raise
        return stream

    def cancel(self, stream: DeltaStream) -> None:
        """Abort the request in vLLM; its stream ends (without an error) at the next read."""
        with self._lock:
            held = self._streams.pop(stream.request_id, None)
        if held is not None and not self._closed.is_set():
            try:
                self._send({"op": "abort", "id": stream.request_id})
            except LpxError:
                pass
        stream.queue.put(DONE)

    def iteration_stats(self) -> dict[str, Any] | None:
        """vLLM's scheduler state as TensorRT-LLM IterationStats keys (sent by the worker)."""
        return self._last_stats

    def close(self) -> None:
        """End vLLM's process (its stdin closes: it shuts the engine down), then its group. Safe twice."""
        if getattr(self, "_closing", False):
            return
        self._closing = True
        self._closed.set()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # vLLM's engine-core process, whatever is left
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.queue.put(DONE)
