"""Structured output's cost per token on the torch engine: tok/s of the same requests with and without a
JSON schema (the grammar processor, pipeline/runtime/engines/grammar.py), the demo's engine by default.

    .venv/bin/python scripts/bench_structured.py [--engine-dir DIR] [--requests 8] [--max-tokens 128]

Each round sends `--requests` concurrent requests (temperature 1, a fixed seed per round) and counts
the generated tokens over the wall time; a round is repeated `--rounds` times and the median is printed.
The schema asks for a long answer (an array of up to 40 short strings), so constrained requests run
about as long as unconstrained ones.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bench.script import run_script
from pipeline.bench.structured import run


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--engine-dir", type=Path, default=None, help="a torch engine folder (default: the demo's)"
    )
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    return ap


def main() -> int:
    return run_script(run, parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
