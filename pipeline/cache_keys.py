"""Cache keys: a stage's key is the hash of the canonical JSON of everything that shapes its output,
and a changed key is explained by naming what changed.

Each stage builds its own inputs (pipeline/stages/<stage>): the keys of the artifacts it reads, the
config values it uses, what it generates from them (the composed trtllm-build argv, the config.pbtxt
texts, the LLM-API options), the versions of the tools that write the output, and under "code" a
fingerprint of its own modules, so a change to LPX's rules re-runs the stage even when LPX's version
number stays the same. What does not shape the output (timeouts, log settings, output paths) is left
out, so changing it re-runs nothing.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
from pathlib import Path

KEY_LENGTH = 12
UNSET = "<unset>"


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def make_key(inputs: dict) -> str:
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()[:KEY_LENGTH]


def file_fingerprint(path: Path, content_limit: int = 64 << 20) -> dict[str, object]:
    """Identity of a file or folder: content hash of small files, size + mtime of large ones."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    out: dict[str, object] = {}
    for f in files:
        if "__pycache__" in f.parts:
            continue
        rel = f.name if f == path else str(f.relative_to(path))
        st = f.stat()
        if st.st_size <= content_limit:
            out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        else:
            out[rel] = f"size={st.st_size},mtime={st.st_mtime_ns}"
    return out


def code_fingerprint(modules: tuple[str, ...] | list[str]) -> dict[str, str]:
    """module name -> hash of its source file (a package: its __init__.py), found without importing it."""
    out = {}
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            raise RuntimeError(
                f"no source for module {name} - an LPX stage lists a module that does not exist"
            )
        out[name] = hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:16]
    return out


# ------------------------------------------------------------------ explaining a changed key


def flatten(obj: object, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def _short(v: object) -> str:
    s = canonical_json(v) if not isinstance(v, str) else v
    return s if len(s) <= 40 else s[:37] + "..."


def _argv_pairs(argv: list[str]) -> dict[str, str]:
    """A command line as flag -> value (a flag without a value maps to "")."""
    out, flag = {}, None
    for token in argv[1:]:
        if token.startswith("--"):
            flag = token
            out[flag] = ""
        elif flag is not None:
            out[flag] = token
            flag = None
    return out


def _text_change(old: str, new: str) -> str:
    """The first changed line of two texts, as 'old line' -> 'new line'."""
    removed = added = ""
    for line in difflib.ndiff(old.splitlines(), new.splitlines()):
        if line.startswith("- ") and not removed:
            removed = line[2:].strip()
        elif line.startswith("+ ") and not added:
            added = line[2:].strip()
    return f"{removed or UNSET!s} -> {added or UNSET!s}"


def _section(name: str, old: object, new: object) -> list[str]:
    if name == "code" and isinstance(old, dict) and isinstance(new, dict):
        return [
            f"code of {m} {'changed' if m in old and m in new else 'added' if m in new else 'dropped'}"
            for m in sorted(set(old) | set(new))
            if old.get(m) != new.get(m)
        ]
    if name.endswith("argv") and isinstance(old, list) and isinstance(new, list):
        a, b = _argv_pairs(old), _argv_pairs(new)
        return [
            f"{name} changed: {flag} {a.get(flag, UNSET)} -> {b.get(flag, UNSET)}"
            for flag in [*b, *(f for f in a if f not in b)]
            if a.get(flag) != b.get(flag)
        ]
    if name.endswith(".pbtxt") and isinstance(old, dict) and isinstance(new, dict):
        return [
            f"{name} of {model} changed: {_text_change(str(old.get(model, '')), str(new.get(model, '')))}"
            for model in sorted(set(old) | set(new))
            if old.get(model) != new.get(model)
        ]
    a, b = flatten(old, name), flatten(new, name)
    return [
        f"{k}: {_short(a.get(k, UNSET))} -> {_short(b.get(k, UNSET))}"
        for k in sorted(set(a) | set(b))
        if a.get(k, UNSET) != b.get(k, UNSET)
    ]


def explain(old: dict, new: dict) -> list[str]:
    """What changed between two stages' inputs, one line per change, in the order of `new`'s sections:
    'code of pipeline.x changed', 'argv changed: --flag a -> b', 'config.pbtxt of m changed: a -> b',
    else 'section.key: a -> b'."""
    names = [*new, *(k for k in old if k not in new)]
    out: list[str] = []
    for name in names:
        if old.get(name, UNSET) != new.get(name, UNSET):
            out += _section(name, old.get(name, UNSET), new.get(name, UNSET)) or [f"{name} changed"]
    return out
