import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")
# ruff: noqa: E402 - the stub starts in the C locale: set UTF-8 before any heavy import (docs/architecture.md)

"""The vllm target's `tensorrt_llm` model (decoupled): vLLM's AsyncLLM, in a process of its own that runs
with vLLM's environment (pipeline/runtime/engines/vllm_engine.py; docs/vllm.md says why), behind the same
tensors, sampling rules and streaming behaviour as the torch engine (pipeline/runtime/engine_model.py), so
LPX's preprocessing, postprocessing, ensemble and BLS work unchanged.
Parameters: vllm_dir and tokenizer_dir (relative to this model's folder), max_tokens_cap,
exclude_input_in_output (default for the request input of that name), stats_check_period_ms (how often the
TensorRT-LLM backend's metric families are updated from vLLM's scheduler state: pipeline/runtime/trtllm_metrics.py).
"""

from transformers import AutoTokenizer

from pipeline.runtime.engine_model import GenerationModel, eos_ids
from pipeline.runtime.engines.vllm_engine import VllmEngine


class TritonPythonModel(GenerationModel):
    label = "tensorrt_llm (vllm)"

    def initialize(self, args: dict) -> None:
        resolve = self.setup(args)
        self.engine = VllmEngine(resolve("vllm_dir", "1/engine"))
        checkpoint = self.engine.folder / self.engine.meta["model"]
        self.tokenizer = AutoTokenizer.from_pretrained(resolve("tokenizer_dir", str(checkpoint)))
        self.eos_ids = eos_ids(checkpoint)
        self.start_metrics(args)
