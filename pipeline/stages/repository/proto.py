"""Triton's model-configuration messages (`tritonclient.grpc.model_config_pb2`, the ModelConfig protobuf
every `config.pbtxt` is printed from), loaded without running `tritonclient.grpc`'s package `__init__`.

That `__init__` imports grpc, numpy and ml_dtypes (about 0.3 s on 2 cores) for the client classes, which
the repository stage never uses; the stage's key is the `config.pbtxt` text, computed on every run,
cached ones too (docs/architecture.md, "A cached run imports nothing heavy"). The module is registered
under its own name, so a later `import tritonclient.grpc` (the gateway, the clients) finds it in
`sys.modules` and uses this very module: one set of message classes and one descriptor-pool entry."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "tritonclient.grpc.model_config_pb2"


def _load() -> ModuleType:
    loaded = sys.modules.get(NAME)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("tritonclient")
    if package is None or package.origin is None:  # not installed: the ordinary import says so
        from tritonclient.grpc import model_config_pb2

        return model_config_pb2
    spec = importlib.util.spec_from_file_location(
        NAME, Path(package.origin).parent / "grpc" / "model_config_pb2.py"
    )
    if spec is None or spec.loader is None:
        from tritonclient.grpc import model_config_pb2

        return model_config_pb2
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[NAME]
        raise
    return module


mc = _load()
