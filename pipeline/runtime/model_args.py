"""Helpers for LPX's Triton python models (model_repo/): they run in Triton's stub, which imports LPX
from the same environment. Keep this module free of heavy imports."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# Triton's python stub ignores PYTHONPATH: folders in this variable are put on sys.path by every LPX
# model instead (e.g. a TensorRT-LLM installed outside the environment the stub runs in).
PATH_VARIABLE = "LPX_TRITON_PYTHONPATH"


def extend_sys_path() -> list[str]:
    """Put the folders of $LPX_TRITON_PYTHONPATH first on sys.path (once each); returns them."""
    added = [p for p in os.environ.get(PATH_VARIABLE, "").split(os.pathsep) if p]
    for path in reversed(added):
        if path not in sys.path:
            sys.path.insert(0, path)
    return added


def model_params(args: dict) -> tuple[Path, dict[str, str]]:
    """(the model's folder, its config.pbtxt `parameters` as strings) from initialize()'s args; also
    applies $LPX_TRITON_PYTHONPATH."""
    extend_sys_path()
    config = json.loads(args["model_config"])
    params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    return Path(args["model_repository"]), params


def eos_ids_in(folder: Path, name: str) -> list[int]:
    """The eos_token_id of one JSON file in `folder` (an int or a list), as a list; [] if absent or unreadable."""
    try:
        eos = json.loads((Path(folder) / name).read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return []
    return [eos] if isinstance(eos, int) else [e for e in (eos or []) if isinstance(e, int)]


def end_ids(folder: Path, tokenizer) -> list[int]:
    """Every end-of-sequence id: generation_config.json's eos_token_id (an int or a list) first, then
    config.json's and the tokenizer's; duplicates removed, order kept. Preprocessing ends requests on
    these; the engine target's xgrammar tokenizer info lists them as its stop ids."""
    ids = eos_ids_in(folder, "generation_config.json") + eos_ids_in(folder, "config.json")
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return list(dict.fromkeys(i for i in ids if i >= 0))


def triton_error(message: str, invalid: bool):
    """A TritonError; INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT) for a bad request, else INTERNAL."""
    import triton_python_backend_utils as pb_utils

    code = getattr(pb_utils.TritonError, "INVALID_ARG", None) if invalid else None
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


# How often a stream asks Triton whether its client has gone. In the python backend each ask is a round
# trip through tritonserver (PbCancel::IsCancelled waits for the stub's parent to answer), as each
# response_sender.send is: asked before every token it made two round trips a token instead of one, each
# waiting for a core on a busy CPU. Asked this often, an abandoned request runs at most this much longer,
# plus the token being generated when the check comes.
CANCEL_CHECK_S = 0.05


def cancelled(sender) -> bool:
    """True once the client has cancelled the request (Triton >= 2.40 tells the python backend)."""
    check = getattr(sender, "is_cancelled", None)
    return bool(check and check())


class CancelWatch:
    """cancelled(sender), asked at most every `period_s`: never on the first call (the first token goes
    out at once), then on the first call `period_s` or more after the last ask. True stays True."""

    def __init__(self, sender, period_s: float = CANCEL_CHECK_S) -> None:
        self.sender, self.period_s = sender, period_s
        self.next: float | None = None
        self.seen = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.next is None:
            self.next = now + self.period_s
        elif not self.seen and now >= self.next:
            self.seen, self.next = cancelled(self.sender), now + self.period_s
        return self.seen
