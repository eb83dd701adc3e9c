"""Reading one Triton request's input tensors in LPX's python models (engine_model.py): by name, as
scalars with defaults, as TensorRT-LLM word lists, and the guided-decoding strings. Runs inside Triton's
python stub: `triton_python_backend_utils` is imported when first needed."""

from __future__ import annotations

from typing import Any

import numpy as np

# Upstream's guided-decoding inputs (strings), passed to submit() when the engine honours them
GUIDE_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")


def pb_utils() -> Any:
    import triton_python_backend_utils as utils

    return utils


def given_inputs(request, names) -> dict[str, np.ndarray]:
    """The inputs this request carries, by name (absent ones left out)."""
    out = {}
    for name in names:
        tensor = pb_utils().get_input_tensor_by_name(request, name)
        if tensor is not None:
            out[name] = tensor.as_numpy()
    return out


def scalar(request, name: str, default, kind=int):
    tensor = pb_utils().get_input_tensor_by_name(request, name)
    return default if tensor is None else kind(tensor.as_numpy().reshape(-1)[0])


def guide_options(request, supported: frozenset[str]) -> dict[str, str]:
    """The request's guided-decoding inputs as text (empty ones left out), for an engine that honours
    them (validate.py has refused them already for one that does not)."""
    out = {}
    for name in GUIDE_INPUTS:
        tensor = pb_utils().get_input_tensor_by_name(request, name) if name in supported else None
        flat = tensor.as_numpy().reshape(-1) if tensor is not None else ()
        value = flat[0] if len(flat) else b""
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        if text:
            out[name] = text
    return out


def words(request, name: str) -> list[list[int]]:
    """[2, n] TensorRT-LLM word list (ids row, end-offsets row, -1 padded) -> list of id sequences."""
    tensor = pb_utils().get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    arr = tensor.as_numpy().reshape(2, -1)
    out, start = [], 0
    for end in arr[1]:
        if end < 0:
            break
        out.append([int(t) for t in arr[0][start:end]])
        start = int(end)
    return [w for w in out if w]
