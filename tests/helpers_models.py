"""Import LPX's Triton python models (model_repo/<name>/model.py) outside Triton, for unit tests."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_model_module(name: str) -> types.ModuleType:
    """Import model_repo/<name>/model.py with a stand-in for Triton's triton_python_backend_utils
    (only the FINAL flag constant is needed at import time)."""
    sys.modules.setdefault("triton_python_backend_utils", types.SimpleNamespace(TRITONSERVER_RESPONSE_COMPLETE_FINAL=1))
    spec = importlib.util.spec_from_file_location(f"lpx_model_{name}", ROOT / "model_repo" / name / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
