import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")
# ruff: noqa: E402 - the stub starts in the C locale: set UTF-8 before any heavy import (docs/architecture.md)

"""LPX's torch reference engine, served under the name `tensorrt_llm` (decoupled): the torch target.

The tensors, sampling rules and streaming behaviour are pipeline/runtime/engine_model.py's (shared with the
llmapi target's model); the engine is `TorchEngine` (transformers' continuous batching over the
restored ModelOpt model).
Parameters: gpt_model_path and tokenizer_dir (relative to this model's folder), max_tokens_cap,
exclude_input_in_output (default for the request input of that name), batch_invariant (default true:
attention per request, see pipeline/runtime/engines/batch_invariant.py), stats_check_period_ms (how often the
TensorRT-LLM backend's metric families are updated: pipeline/runtime/trtllm_metrics.py; default 100).
"""

from transformers import AutoTokenizer

from pipeline.runtime.engine_model import GenerationModel, eos_ids, ready, stop_at  # noqa: F401 - the tests' names
from pipeline.runtime.engines.torch_engine import TorchEngine


class TritonPythonModel(GenerationModel):
    label = "tensorrt_llm (torch)"

    def initialize(self, args: dict) -> None:
        resolve = self.setup(args)
        self.engine = TorchEngine(
            resolve("gpt_model_path", "1/engine"),
            batch_invariant=self.flag("batch_invariant"),
            tokenizer_dir=resolve("tokenizer_dir", "1/engine"),
        )
        self.tokenizer = AutoTokenizer.from_pretrained(resolve("tokenizer_dir", "1/engine"))
        self.eos_ids = eos_ids(resolve("gpt_model_path", "1/engine"))
        self.start_metrics(args)
