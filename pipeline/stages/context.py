"""What every stage of one run shares: the config, the terminal, the artifact store, and what is read
once and reused (the checkpoint's config and fingerprint, the text samples, the GPUs to check fit on)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..artifacts import Store
from ..cache_keys import file_fingerprint
from ..config import Config
from ..inspection.checkpoint import CheckpointInfo, inspect_checkpoint
from ..progress import Reporter
from ..texts import TextSet, load_texts

ANY_ARCH = (
    "any"  # the slot of artifacts that run on any GPU (or none): quantize, eval, torch and llmapi builds
)


@dataclass
class Context:
    cfg: Config
    report: Reporter
    store: Store
    _cache: dict = field(default_factory=dict)

    def checkpoint(self) -> tuple[CheckpointInfo, dict]:
        """The source checkpoint, inspected once: (its info, its fingerprint for the keys)."""
        if "checkpoint" not in self._cache:
            m = self.cfg.model
            info = inspect_checkpoint(m.checkpoint, m.allow_pickle, tokenizer=m.tokenizer)
            fp = file_fingerprint(info.path)
            if m.tokenizer:
                fp = {"checkpoint": fp, "tokenizer": file_fingerprint(m.tokenizer)}
            self._cache["checkpoint"] = (info, fp)
        return self._cache["checkpoint"]

    def texts(self, section: str) -> TextSet:
        """The samples of `calibration` or `evaluation`, read (and checked) once."""
        if section not in self._cache:
            self._cache[section] = load_texts(getattr(self.cfg, section), key=section)
        return self._cache[section]

    def cached(self, name: str, make):
        """A value computed once per run (e.g. the GPUs a build is checked against)."""
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]
