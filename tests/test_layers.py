"""The package's shape, checked: the documented layer order (function-level imports included), no import
cycle, click only in the CLI, one home per fact, and no citation of files outside the repository."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports, anywhere in its code (inside functions too,
    not under `if TYPE_CHECKING`). `from x import y` counts as importing x.y when that is a module."""
    root = package.parent
    files = {module_name(p, root): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            if _type_checking_only(node, parents):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in files else source
                    for alias in node.names
                ]
            else:
                continue
            edges |= {t for t in targets if t in files and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The layers, top down: a unit may import only units of layers below its own (and itself). A unit is a
# package or module directly under pipeline/, except the stages, each of which is a unit of its own.
# docs/architecture.md's "Layers" block shows the same list; test_the_docs_show_these_layers keeps them equal.
LAYERS: list[tuple[str, ...]] = [
    ("__main__",),
    ("cli",),
    ("tune",),
    ("bench",),
    ("monitoring",),
    ("deploy",),
    ("served",),
    ("gc",),
    ("runner",),
    ("gateway",),
    ("stages.repository",),
    ("stages.build", "stages.evaluate"),
    ("stages.quantize",),
    ("stages.context", "stages"),
    ("client",),
    ("inspection",),
    ("servers",),
    ("runtime",),
    ("texts",),
    ("config",),
    ("demo", "examples"),
    ("gguf_file",),
    ("artifacts", "cache_keys", "progress", "slo", "toolchain", "facts"),
    ("errors", "trace", "data", "atomic", ""),
]


def unit_of(module: str) -> str:
    """pipeline.stages.build.trtllm_run -> stages.build; pipeline.gateway.app -> gateway; pipeline -> ''."""
    parts = module.split(".")[1:]
    return ".".join(parts[:2]) if parts[:1] == ["stages"] and len(parts) > 1 else ".".join(parts[:1])


def layer_violations(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    """Each import that runs sideways or up the layers, and each unit the list does not place."""
    rank = {unit: i for i, layer in enumerate(layers) for unit in layer}
    out = sorted({f"{unit_of(m)} is in no layer ({m})" for m in graph if unit_of(m) not in rank})
    for module, targets in sorted(graph.items()):
        a = unit_of(module)
        for target in sorted(targets):
            b = unit_of(target)
            if a != b and a in rank and b in rank and rank[a] >= rank[b]:
                out.append(f"{module} imports {target}: {a or 'pipeline'} may not use {b or 'pipeline'}")
    return out


def test_every_import_runs_down_the_layers():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and graph["pipeline.served"], "the import graph was not read"
    assert layer_violations(graph, LAYERS) == []


def test_the_layer_check_finds_an_upward_import():
    graph = {
        "pipeline.client": {"pipeline.bench.openai_load"},  # the low client reaching up into bench
        "pipeline.bench.openai_load": {"pipeline.errors"},
        "pipeline.errors": set(),
        "pipeline.newpkg.x": set(),
    }
    assert layer_violations(graph, LAYERS) == [
        "newpkg is in no layer (pipeline.newpkg.x)",
        "pipeline.client imports pipeline.bench.openai_load: client may not use bench",
    ]


def test_the_docs_show_these_layers():
    """docs/architecture.md's Layers block names the units in this order (each line starts with them)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    shown = [
        tuple(u.rstrip("/").removesuffix(".py").replace("/", ".") for u in line.split("|")[0].split())
        for line in block.splitlines()
    ]
    shown = [units for units in shown if units and units[0] != "```"]
    assert shown == [tuple(u if u else "pipeline" for u in layer) for layer in LAYERS]


def test_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and graph["pipeline.runner"], "the import graph was not read"
    assert cycles(graph) == [], "import cycles (each line: modules that import each other)"


def test_the_cycle_check_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")  # a function-level import counts
    (pkg / "c.py").write_text(
        "from pkg import a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n"
    )
    (pkg / "d.py").write_text("from .c import x\n")  # only reached under TYPE_CHECKING: no cycle
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def _sources(*folders: str, suffixes=(".py",)) -> dict[Path, str]:
    out = {}
    for folder in folders:
        for p in (ROOT / folder).rglob("*"):
            if p.suffix in suffixes and "__pycache__" not in p.parts and p.is_file():
                out[p] = p.read_text(encoding="utf-8")
    return out


def test_click_only_in_the_cli():
    users = sorted(
        str(p.relative_to(ROOT))
        for p, text in _sources("pipeline").items()
        if re.search(r"^\s*(import click|from click)", text, re.M)
        and "cli" not in p.relative_to(PACKAGE).parts
    )
    assert users == []


def test_one_home_per_fact():
    code = {p: t for p, t in _sources("pipeline").items()}
    where = lambda pattern: sorted(  # noqa: E731
        str(p.relative_to(PACKAGE)) for p, t in code.items() if re.search(pattern, t, re.M)
    )
    assert where(r"nvidia-smi\"") == ["facts/gpu.py"]  # every nvidia-smi call
    assert where(r"^def contract_version\b") == ["facts/trtllm.py"]
    assert where(r"^def detect_gpu\b") == ["facts/gpu.py"]
    assert where(r"^class Gpu\b") == ["facts/gpu.py"]
    assert where(r"tritonserver:\d") == ["facts/trtllm.py"]  # container tags
    assert where(r"\"v0\.16\.0\"") == sorted(
        [
            "facts/trtllm.py",
            "stages/build/trtllm_build.py",
            "stages/repository/engine_repo.py",
            "runtime/tensors.py",
            "runtime/upstream_io.py",
            "runtime/upstream_trtllm.py",
        ]
    )  # the line table names the contract; per-version contract tables are keyed by it


# Names of files outside the repository (the team's design notes, the shared contracts folder), spelled
# in pieces so that this test's own source does not cite them.
OUTSIDE_CITATION = "|".join(("DESIGN" + r"\.md", "shared" + "/contracts", r"\.\./" + "shared"))


def test_the_repository_stands_alone():
    text = _sources("pipeline", "model_repo", "tests", "scripts", "docs", suffixes=(".py", ".md", ".sh"))
    text[ROOT / "README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    here = Path(__file__).resolve()
    cited = sorted(
        str(p.relative_to(ROOT)) for p, t in text.items() if p != here and re.search(OUTSIDE_CITATION, t)
    )
    assert cited == []


def test_help_imports_nothing_heavy():
    """`lpx --help` lists every command without importing pydantic, numpy, rich, torch or tritonclient
    (each command imports what it needs when it runs), so it starts in a fraction of a second."""
    import subprocess

    code = (
        "import sys; from click.testing import CliRunner; from pipeline.cli import cli; "
        "out = CliRunner().invoke(cli, ['--help']).output; assert 'quantize' in out and 'plan' in out, out; "
        "print(sorted(m for m in ('pydantic', 'numpy', 'rich', 'yaml', 'torch', 'transformers', 'tritonclient') "
        "if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
