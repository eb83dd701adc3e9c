"""scripts/*.py are their arguments and one call into pipeline/bench/: none edits sys.path or imports another
script, each answers --help from the repository root with the venv's python (where `pipeline` is installed)
without importing torch, transformers or tritonclient, and every `scripts/X.py ...` command line that the
README and docs/ show parses with that script's own parser."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND = re.compile(r"scripts/(\w+)\.py\b([^`|#;&)\n]*)")
HEAVY = ("torch", "transformers", "tritonclient", "modelopt", "vllm")


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scripts_are_arguments_and_one_call():
    assert len(SCRIPTS) >= 10, "the scripts were not found"
    for path in SCRIPTS:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        uses = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not any(u.startswith("sys.path") for u in uses), f"{path.name} edits sys.path"
        imported = {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        } | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        siblings = imported & {p.stem for p in SCRIPTS}
        assert not siblings, (
            f"{path.name} imports the scripts {sorted(siblings)}: move what it needs to pipeline/bench/"
        )
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert functions == ["parser", "main"], f"{path.name} defines {functions}, not parser() and main()"


def test_each_script_answers_help_without_heavy_imports():
    """In one child: every script loaded and its help formatted; none of HEAVY imported on the way."""
    code = (
        "import importlib.util, json, sys\n"
        f"paths = {json.dumps([str(p) for p in SCRIPTS])}\n"
        "for p in paths:\n"
        "    spec = importlib.util.spec_from_file_location('s', p)\n"
        "    m = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(m)\n"
        "    assert m.parser().format_help().startswith('usage: ')\n"
        f"print(json.dumps(sorted(set(m.split('.')[0] for m in sys.modules) & set({list(HEAVY)!r}))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_script_runs_from_the_repository_root_as_documented():
    """`python scripts/bench_vllm.py --help` with no PYTHONPATH: `pipeline` comes from the installed venv;
    a bad flag value is one line naming the fix, exit 2, no traceback."""
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(ROOT)}
    ok = subprocess.run(
        [sys.executable, "scripts/bench_vllm.py", "--help"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0 and "--trace-requests" in ok.stdout, ok.stderr
    bad = subprocess.run(
        [sys.executable, "scripts/bench_vllm.py", "--out", str(ROOT / "no-such"), "--servers", "lpx,vllm"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "--servers: lpx,vllm - choose among lpx-vllm, lpx-torch, vllm-own"
    assert not (ROOT / "no-such").exists()


RUN = re.compile(r"(python3?|\.venv/bin/python) $")  # what a complete command line has before the script


def documented() -> list[tuple[str, str, list[str], bool]]:
    """(where, script, its words, complete) for each `scripts/X.py ...` in the README and docs/ (continued
    lines joined; <placeholders> as one word; the command ends at a shell separator, a comment or a code
    span). Complete: run by a python there (a user copies it); else a mention in prose, whose options
    must exist but whose required ones may be left out."""
    out = []
    for doc in DOCS:
        text = re.sub(r"\\\n\s*", " ", doc.read_text(encoding="utf-8"))
        for match in COMMAND.finditer(text):
            if match.group(1) not in {p.stem for p in SCRIPTS}:
                continue
            tail = re.sub(r"<[^>]*>", "X", match.group(2))
            if "$" in tail or "..." in tail or "[" in tail:  # a shell variable, a synopsis
                continue
            try:
                words = shlex.split(tail)
            except ValueError:
                continue
            line_start = text.rfind("\n", 0, match.start()) + 1
            complete = bool(RUN.search(text[line_start : match.start()]))
            where = f"{doc.relative_to(ROOT)}: scripts/{match.group(1)}.py {tail.strip()}"
            out.append((where, match.group(1), words, complete))
    return out


def test_the_docs_show_script_commands():
    complete = {script for _, script, _, whole in documented() if whole}
    assert {"bench_vllm", "bench_quantize", "bench_engine", "bench_gateway", "bench_gateway_ab"} <= complete


@pytest.mark.parametrize("where, script, words, complete", documented(), ids=[d[0] for d in documented()])
def test_each_documented_script_command_parses(where, script, words, complete):
    parser = load(ROOT / "scripts" / f"{script}.py").parser()
    if not complete:
        options = {o for action in parser._actions for o in action.option_strings}
        named = [w.split("=")[0] for w in words if w.startswith("--")]
        assert set(named) <= options, f"{where}: {sorted(set(named) - options)} are no options of the script"
        return
    try:
        parser.parse_args(words)
    except SystemExit as exc:
        pytest.fail(f"{where}: exits {exc.code} ({parser.format_usage().strip()})")
