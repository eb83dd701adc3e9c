"""Terminal output: stage lines and progress bars (rich), quiet when not a terminal."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Reporter:
    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)

    def stage(self, stage: str, target: str, status: str) -> None:
        self.console.print(f"[bold]{stage:<9}[/bold] {target:<24} {status}")

    def info(self, message: str) -> None:
        self.console.print(message)

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {message}")

    @contextlib.contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """A progress bar while the block runs; yields advance(n=1)."""
        progress = Progress(
            TextColumn("  {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,
        )
        with progress:
            tid = progress.add_task(description, total=total)
            yield lambda n=1: progress.advance(tid, n)


def stdout_console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


def quiet_libraries() -> None:
    """Keep transformers' own progress bars and deprecation chatter off LPX's terminal output. Through
    the environment, which transformers reads when it is first imported, so that a run whose stages are
    all cached imports no transformers (and no torch) at all; a transformers already imported is told
    directly."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
