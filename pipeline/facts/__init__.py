"""Facts about the world outside LPX, one table each: TensorRT-LLM lines, GPUs, quantization formats."""
