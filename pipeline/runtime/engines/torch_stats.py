"""TensorRT-LLM's `IterationStats` (the executor's JSON spelling) read from transformers' continuous batching,
so the torch target publishes the backend's metric families from its real state (runtime/trtllm_metrics.py).

What each field is here (docs/monitoring.md has the table for every target):
- numActiveRequests: requests the engine holds (transformers' scheduler: started or waiting for a batch
  slot); numQueuedRequests: requests handed over and not yet taken in (its input queue);
  maxNumActiveRequests: the engine's max_batch_size (transformers' max_requests_per_batch).
- inflightBatchingStats: the last batch the scheduler formed (`BatchLog`): requests in it, those still
  in their prompt (context) and their prompt tokens, those generating; all 0 once nothing is pending.
  Nothing is paused and there is one micro batch.
- kvCacheStats: transformers' paged cache: blocks in all, free (its block manager), used = the
  difference, tokens per block, and blocks reused through prefix sharing (0 while batch_invariant keeps
  sharing off).
- cpuMemUsage / gpuMemUsage: bytes of the engine's tensors on that device (weights, buffers, paged
  cache); on CUDA, what torch has allocated there. pinnedMemUsage: 0 (nothing is pinned).
- iter: batches run so far; timestamp: now, in the executor's format.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from ..trtllm_metrics import TIMESTAMP_FORMAT


class BatchLog:
    """The last batch transformers' scheduler formed. `install` wraps the scheduler of every batch processor
    the manager creates (it creates it on its own thread, when generation starts)."""

    def __init__(self) -> None:
        self.scheduled = self.context = self.context_tokens = 0
        self._lock = threading.Lock()

    def install(self, manager: Any) -> None:
        create = manager._create_batch_processor

        def create_logged():
            processor = create()
            self.watch(processor.scheduler)
            return processor

        manager._create_batch_processor = create_logged

    def watch(self, scheduler: Any) -> None:
        if getattr(scheduler, "_lpx_batch_log", None) is self:
            return
        schedule = scheduler.schedule_batch

        def schedule_logged(*args, **kwargs):
            out = schedule(*args, **kwargs)
            self.record(out[0] or [])
            return out

        scheduler.schedule_batch = schedule_logged
        scheduler._lpx_batch_log = self

    def record(self, batch: list) -> None:
        """A batch of FutureRequestStates: a request with nothing generated yet is in its context phase."""
        context = [f for f in batch if f.state.generated_len() == 0]
        with self._lock:
            self.scheduled, self.context = len(batch), len(context)
            self.context_tokens = sum(int(f.query_length) for f in context)

    def read(self) -> tuple[int, int, int]:
        with self._lock:
            return self.scheduled, self.context, self.context_tokens


def tensor_bytes(model: Any, cache: Any) -> dict[str, int]:
    """Bytes of the model's parameters and buffers and of the paged cache's tensors, per device type."""
    out: dict[str, int] = {}
    tensors = [*model.parameters(), *model.buffers()]
    if cache is not None:
        tensors += [*getattr(cache, "key_cache", []), *getattr(cache, "value_cache", [])]
    for t in tensors:
        out[t.device.type] = out.get(t.device.type, 0) + t.numel() * t.element_size()
    return out


class TorchStats:
    """IterationStats of one TorchEngine: `install` before the manager starts, then `read` from any thread."""

    def __init__(
        self, manager: Any, model: Any, max_batch_size: int, num_blocks: int, block_size: int
    ) -> None:
        self.manager, self.model = manager, model
        self.max_batch_size, self.num_blocks, self.block_size = (
            int(max_batch_size),
            int(num_blocks),
            int(block_size),
        )
        self.log = BatchLog()
        self.log.install(manager)
        self._memory: tuple[Any, dict[str, int]] | None = None  # (the cache it was counted with, bytes)

    def memory(self, cache: Any) -> dict[str, int]:
        if self._memory is None or self._memory[0] is not cache:
            self._memory = (cache, tensor_bytes(self.model, cache))
        return self._memory[1]

    def read(self) -> dict[str, Any]:
        """The engine's state now, as one TensorRT-LLM IterationStats dict."""
        manager = self.manager
        processor = getattr(manager, "batch_processor", None)
        scheduler = getattr(processor, "scheduler", None)
        cache = getattr(processor, "cache", None)
        held = (
            len(scheduler.active_requests) + len(scheduler.waiting_requests) if scheduler is not None else 0
        )
        scheduled, context, context_tokens = self.log.read() if held else (0, 0, 0)
        if cache is not None:
            blocks, free = int(cache.num_blocks), int(cache.get_num_free_blocks())
            per_block = int(cache.block_size)
            reused = int(getattr(cache, "_total_prefix_length", 0)) // per_block
        else:  # generation has not started: the cache the engine asked for, all free
            blocks, free, per_block, reused = self.num_blocks, self.num_blocks, self.block_size, 0
        memory = self.memory(cache)
        gpu = memory.get("cuda", 0)
        if gpu:
            import torch

            gpu = int(torch.cuda.memory_allocated())
        return {
            "timestamp": datetime.now().strftime(TIMESTAMP_FORMAT),
            "iter": int(getattr(manager, "current_batch", 0) or 0),
            "numActiveRequests": held,
            "numQueuedRequests": int(manager.input_queue.qsize()),
            "maxNumActiveRequests": self.max_batch_size,
            "cpuMemUsage": memory.get("cpu", 0),
            "gpuMemUsage": gpu,
            "pinnedMemUsage": 0,
            "kvCacheStats": {
                "maxNumBlocks": blocks,
                "freeNumBlocks": free,
                "usedNumBlocks": blocks - free,
                "tokensPerBlock": per_block,
                "reusedBlocks": reused,
            },
            "inflightBatchingStats": {
                "numScheduledRequests": scheduled,
                "numContextRequests": context,
                "numGenRequests": scheduled - context,
                "numPausedRequests": 0,
                "numCtxTokens": context_tokens,
                "microBatchId": 0,
            },
        }
