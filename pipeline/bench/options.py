"""What one `lpx bench` run is asked: its command-line options as one frozen value (`BenchOptions`), built
once by the CLI (pipeline/cli/tools.py) or by `lpx tune` (pipeline/tune/cells.py), and the parsers of
its text options, which refuse bad input with the fix before anything is served or sent."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import LpxError
from ..slo import parse_slo

DEFAULT_VOCAB = (100, 30000)  # token ids drawn when the served model's vocabulary is unknown


@dataclass(frozen=True)
class BenchOptions:
    """One field per `lpx bench` option (`lpx bench --help` says what each means). `repo` and
    `provenance` are not options: LPX sets them for a variant it serves itself."""

    url: str | None = None
    config_path: Path | None = None
    model: str = "ensemble"
    protocol: str = "grpc"
    api: str = "triton"
    endpoint: str = "chat"
    api_key: str | None = field(default=None, repr=False)
    concurrency: str = "1,4,16,64"
    rate: float | None = None
    burstiness: float = 1.0
    requests: int = 100
    duration: float | None = None
    warmup: int = 10
    input_len: int = 128
    output_len: int = 128
    input_len_std: float = 0.0
    output_len_std: float = 0.0
    dataset: Path | None = None
    dataset_field: str = "prompt"
    vocab: str | None = None  # LO,HI; None: the served model's vocabulary when known
    tokenizer: Path | None = None
    seed: int = 0
    slo: str | None = None
    out: Path | None = None
    label: str | None = None
    variant_ref: str | None = None
    artifact: Path | None = None
    gpu: str | None = None
    checkpoint: Path | None = None
    fmt: str | None = None
    kv_dtype: str | None = None
    repo: Path | None = None  # the served model repository, when LPX knows it
    provenance: dict[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> BenchOptions:
        """From click's keyword options; an unknown name is a programming error, said as such."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"BenchOptions has no field(s) {', '.join(unknown)}")
        return cls(**options)

    def with_(self, **changes: Any) -> BenchOptions:
        return replace(self, **changes)

    @property
    def levels(self) -> list[int] | None:
        """The closed-loop levels; None in open loop (--rate)."""
        return None if self.rate is not None else parse_levels(self.concurrency)

    @property
    def vocab_range(self) -> tuple[int, int] | None:
        """--vocab as (LO, HI); None when not given."""
        return None if self.vocab is None else parse_vocab(self.vocab)

    @property
    def slo_ms(self) -> dict[str, float]:
        return parse_slo(self.slo, "--slo")

    def check(self) -> None:
        """Parse every text option once, so a typo fails before any stage runs or any server starts."""
        _ = (self.levels, self.vocab_range, self.slo_ms)


def parse_levels(text: str, flag: str = "--concurrency") -> list[int]:
    """A comma list of concurrency levels ("1,4,16"); an LpxError naming `flag` and the fix otherwise."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise LpxError(f"Bad {flag} {text!r} - use a comma list such as 1,4,16,64") from None
    if not levels or min(levels) < 1:
        raise LpxError(f"Bad {flag} {text!r} - every level must be >= 1")
    return levels


def parse_vocab(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise LpxError(f"Bad --vocab {text!r} - use LO,HI such as 100,30000") from None
    return lo, hi
