"""Engines LPX serves itself, both with `submit` -> a stream of token deltas (base.py):
torch_engine.py, the reference engine of `build.target: torch` (batch_invariant.py: its per-request
attention); llmapi_engine.py, TensorRT-LLM's LLM API for `build.target: llmapi`."""
