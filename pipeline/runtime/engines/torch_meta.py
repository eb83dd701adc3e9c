"""The torch target's engine description, `lpx_engine.json`: written by the build stage (torch_target),
read by the repository stage and by torch_engine. Its own module, importing nothing heavy, so the stages
that only name or check it (on a cached `lpx run` too) do not import torch through the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import LpxError

META_FILE = "lpx_engine.json"
META_KEYS = (
    "target",
    "format",
    "dtype",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_num_tokens",
    "tokens_per_block",
    "state_file",
)


def read_meta(engine_dir: Path) -> dict[str, Any]:
    """Read and check `lpx_engine.json`; a missing or corrupt file is a LpxError naming the fix."""
    path = Path(engine_dir) / META_FILE
    fix = "rebuild it with 'lpx build -c lpx.yaml'"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LpxError(f"No torch engine at {engine_dir} ({META_FILE} missing) - {fix}") from None
    except (OSError, ValueError) as exc:
        raise LpxError(f"{path} is unreadable or not JSON ({exc}) - {fix}") from None
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise LpxError(f"{path} lacks {', '.join(missing)} - {fix}")
    if meta["target"] != "torch":
        raise LpxError(
            f"{engine_dir} is a '{meta['target']}' engine, not a torch one - {fix} with build.target: torch"
        )
    if not (Path(engine_dir) / meta["state_file"]).is_file():
        raise LpxError(f"{engine_dir} lacks {meta['state_file']} - {fix}")
    return meta
