"""Facts about the world outside LPX, one table each: TensorRT-LLM lines (trtllm.py), GPUs and their
detection (gpu.py), quantization formats (formats.py), published model configs (models.py)."""
