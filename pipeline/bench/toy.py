"""A fixed-delay stand-in for the engine model, for checking the load generator against known truth.

Served as `tensorrt_llm` (decoupled python backend) with the engine's tensors: input_ids,
input_lengths, request_output_len, streaming -> output_ids [1, 1, 1], sequence_length [1, 1], plus
emit_ns [1] (INT64, the server's time.time_ns() right before the send: truth for the client's clock).
Each request's k-th token (k = 0..n-1) leaves at arrival + first_ms + k * every_ms, on absolute
times so no drift accumulates; one sender thread walks a heap of due tokens, so any number of
requests run concurrently. TTFT truth = first_ms, ITL truth = every_ms (plus transport).

With `slots` > 0 the toy is an engine of that many batch slots: at most `slots` requests generate at
once, the others wait in arrival order, and a waiting request starts when a running one sends its last
token (on that token's scheduled time). Its TTFT is then its wait + first_ms: a queue whose answer
under any load can be computed exactly (`lpx tune`'s known-answer test).
"""

from __future__ import annotations

from pathlib import Path

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 256
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true }},
  {{ name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] reshape: {{ shape: [ ] }} }},
  {{ name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] reshape: {{ shape: [ ] }} }},
  {{ name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] reshape: {{ shape: [ ] }} optional: true }}
]
output [
  {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
  {{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "emit_ns" data_type: TYPE_INT64 dims: [ -1 ] }}
]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "first_ms" value: {{ string_value: "{first_ms}" }} }}
parameters {{ key: "every_ms" value: {{ string_value: "{every_ms}" }} }}
parameters {{ key: "first_id" value: {{ string_value: "{first_id}" }} }}
parameters {{ key: "id_span" value: {{ string_value: "{id_span}" }} }}
parameters {{ key: "slots" value: {{ string_value: "{slots}" }} }}
"""

MODEL = """
import collections
import heapq
import itertools
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.first = float(params["first_ms"]["string_value"]) / 1e3
        self.every = float(params["every_ms"]["string_value"]) / 1e3
        self.first_id = int(params["first_id"]["string_value"])
        self.span = int(params["id_span"]["string_value"])
        self.slots = int(params["slots"]["string_value"])  # 0: no limit
        self.active, self.waiting = 0, collections.deque()
        self.heap, self.seq = [], itertools.count()
        self.cv = threading.Condition()
        self.running = True
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def execute(self, requests):
        now = time.monotonic()
        with self.cv:
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().reshape(-1)[0])
                sender = request.get_response_sender()
                if n <= 0:
                    sender.send(flags=FINAL)
                    continue
                if self.slots and self.active >= self.slots:
                    self.waiting.append((sender, n))
                    continue
                self.active += 1
                heapq.heappush(self.heap, (now + self.first, next(self.seq), sender, 0, n, now))
            self.cv.notify()
        return None

    def loop(self):
        while self.running:
            with self.cv:
                while self.running and (not self.heap or self.heap[0][0] > time.monotonic()):
                    self.cv.wait(timeout=(self.heap[0][0] - time.monotonic()) if self.heap else None)
                if not self.running:
                    return
                due, _, sender, k, n, start = heapq.heappop(self.heap)
                if k + 1 < n:
                    heapq.heappush(self.heap, (start + self.first + (k + 1) * self.every, next(self.seq),
                                               sender, k + 1, n, start))
                else:
                    self.active -= 1
                    if self.waiting:  # the slot passes on at this token's scheduled time
                        waiter, m = self.waiting.popleft()
                        self.active += 1
                        heapq.heappush(self.heap, (due + self.first, next(self.seq), waiter, 0, m, due))
            ids = pb_utils.Tensor("output_ids", np.array([[[self.first_id + k % self.span]]], dtype=np.int32))
            length = pb_utils.Tensor("sequence_length", np.array([[1]], dtype=np.int32))
            emit = pb_utils.Tensor("emit_ns", np.array([[time.time_ns()]], dtype=np.int64))
            sender.send(pb_utils.InferenceResponse([ids, length, emit]), flags=FINAL if k + 1 == n else 0)

    def finalize(self):
        with self.cv:
            self.running = False
            self.cv.notify()
        self.thread.join(timeout=5)
"""


def write_toy_repo(
    root: Path,
    first_ms: float,
    every_ms: float,
    first_id: int = 1000,
    id_span: int = 2**30,
    slots: int = 0,
    name: str = "tensorrt_llm",
) -> Path:
    """A model repository holding the fixed-delay model `name` (more can be added to the same root);
    returns `root`. The k-th token of a request is first_id + k % id_span (a span inside a tokenizer's
    vocabulary makes it decodable); `slots` > 0 limits how many requests generate at once."""
    model = Path(root) / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(
        CONFIG.format(
            name=name, first_ms=first_ms, every_ms=every_ms, first_id=first_id, id_span=id_span, slots=slots
        )
    )
    (model / "1" / "model.py").write_text(MODEL)
    return Path(root)
