"""LPX: Hugging Face checkpoint -> ModelOpt -> TensorRT-LLM engine -> Triton, measured."""

__version__ = "0.1.0"
