"""The stand-in's tensorrt_llm.llmapi (tests only): the names LPX imports from it, as upstream exports them
(tests/contracts/trtllm_llmapi_python.json, imports)."""

from . import LLM, GuidedDecodingParams, SamplingParams

__all__ = ["LLM", "GuidedDecodingParams", "SamplingParams"]
