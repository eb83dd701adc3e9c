"""The one call each of scripts/*.py makes: its parsed arguments handed to the library function that does its
work (pipeline/bench/), and an error the user can fix (pipeline/errors.py) printed as its one line - the
fix - with its exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..errors import LpxError


def run_script(run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """`run(args)`'s exit status (None counts as 0); an LpxError's message on stderr and its exit code."""
    try:
        return run(args) or 0
    except LpxError as exc:
        print(exc.message, file=sys.stderr)
        if exc.detail:
            print(exc.detail, file=sys.stderr)
        return exc.exit_code
