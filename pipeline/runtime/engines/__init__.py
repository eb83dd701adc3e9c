"""Engines LPX serves itself. `torch_engine`: the reference engine for `build.target: torch`."""

from .torch_engine import RequestStream, TorchEngine, load_model, read_meta

__all__ = ["RequestStream", "TorchEngine", "load_model", "read_meta"]
