"""The base of every lpx.yaml section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are errors; assignments are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
