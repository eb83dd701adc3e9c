"""Every `lpx ...` command line the README and docs/ show parses with the real CLI: its command exists, every
option it names exists and gets a value of the right kind, no argument is left over and no required option is
missing. A user copies these lines; one that exits 2 is a bug (README's `lpx keys add ci-client` did).

Parsing only: no command runs. A value click checks against the file system (a config path that does not
exist here) is the one error accepted, since the docs name the user's files."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from pipeline.cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```")
SHELL_SEPARATORS = ("&&", "||", ";", "|", ">", ">>", "2>&1")


def _fenced_lines(text: str) -> list[str]:
    lines, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def _commands(line: str) -> list[list[str]]:
    """The `lpx` invocations on one shell line (after `$ ` prompts, env assignments and `&&` chains), with
    the comment cut off; [] for a line that is not shell or names no lpx command."""
    line = line.strip().removeprefix("$ ")
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # not shell (YAML, output, prose with an apostrophe)
        return []
    out, current = [], []
    for word in [*words, ";"]:
        if word in SHELL_SEPARATORS:
            out.append(current)
            current = []
        else:
            current.append(word)
    found = []
    for cmd in out:
        while cmd and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", cmd[0]):  # LPX_HOME=... lpx run
            cmd = cmd[1:]
        if (
            cmd
            and cmd[0] in ("lpx", ".venv/bin/lpx")
            and not any(w.startswith(("<", "[", "(")) or w in ("/", "|") or "..." in w for w in cmd)
        ):  # a synopsis with placeholders is documentation of the grammar, not a command line
            found.append(cmd[1:])
    return found


INLINE = re.compile(r"`((?:LPX_[A-Z_]+=\S+ )*lpx [^`]+)`")
SCREEN = re.compile(r"^\s*lpx top - ")  # the first line of `lpx top`'s screen, shown as output


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """Every lpx command line in a fenced block (complete: a user runs it as it is) or an inline code span
    of the README and docs/ (a mention: `lpx compare` names the command, its required options may be left
    out, but every word it does show must parse)."""
    seen, out = set(), []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        fenced = [(ln, True) for ln in _fenced_lines(text) if not SCREEN.match(ln)]
        for line, complete in fenced + [(span, False) for span in INLINE.findall(text)]:
            for args in _commands(line):
                if args and tuple(args) not in seen:
                    seen.add(tuple(args))
                    out.append((f"{doc.name}: lpx {' '.join(args)}", args, complete))
    return out


def parse(args: list[str]) -> None:
    """Resolve and parse `lpx ARGS` down to the leaf command, as click would before invoking it."""
    ctx = cli.make_context("lpx", list(args), resilient_parsing=False)
    group, rest = cli, ctx.protected_args + ctx.args
    while isinstance(group, click.Group) and rest:
        name, cmd, rest = group.resolve_command(ctx, rest)
        assert cmd is not None, f"no command {name!r}"
        ctx = cmd.make_context(name, list(rest), parent=ctx)
        group, rest = cmd, ctx.protected_args + ctx.args if isinstance(cmd, click.Group) else []


COMMANDS = documented_commands()


def test_the_docs_show_commands() -> None:
    """The scan finds the commands (a broken scanner would pass every doc)."""
    assert len(COMMANDS) >= 40, [c[0] for c in COMMANDS]
    assert any(args[:2] == ["keys", "add"] for _, args, _ in COMMANDS)


@pytest.mark.parametrize("args,complete", [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_documented_command_parses(args: list[str], complete: bool) -> None:
    try:
        parse(args)
    except (click.MissingParameter, click.exceptions.NoArgsIsHelpError):
        if complete:
            raise
    except click.BadOptionUsage as exc:  # `lpx bench -c` in prose: the option named, its value left out
        if complete or "requires an argument" not in exc.format_message():
            raise
    except click.BadParameter as exc:
        if "does not exist" not in exc.format_message():
            raise
    except click.exceptions.Exit:  # --help, --version
        pass


@pytest.mark.parametrize(
    "args",
    [["keys", "add", "ci-client"], ["deploy", "k8s", "--no-such-flag"], ["no-such-command"]],
)
def test_the_parser_refuses_what_click_refuses(args: list[str]) -> None:
    """Negative controls: the same parse refuses an extra argument, an unknown flag, an unknown command."""
    with pytest.raises(click.UsageError):
        parse(args)
