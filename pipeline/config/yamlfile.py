"""Reading lpx.yaml into plain data: UTF-8 YAML text whose top level is a mapping. Every way that fails -
missing, a folder, too large, binary, UTF-16, not UTF-8, a control character, a YAML syntax error, a key
given twice, empty, a list or a scalar at the top - is a UsageError / ConfigError (exit 2) naming the file,
the line where there is one, and the fix.

ConfigLoader is yaml.SafeLoader (the same constructors: plain data, never Python objects) plus two rules:
a key given twice in one mapping is refused (YAML says keys are unique; PyYAML keeps the last one silently),
and `1e-3` without a dot is a float, as in YAML 1.2 (PyYAML's YAML 1.1 reads it as a string, which the
strict schema would then refuse). Merge keys (`<<: *anchor`) work as YAML defines them: a key written beside
a merge overrides the merged one and is not a duplicate.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

import yaml

from ..errors import ConfigError, UsageError

MAX_BYTES = 1 << 20  # an lpx.yaml is a few KiB; a larger file is almost surely the wrong file
START = "'lpx init DIR' writes a working lpx.yaml to start from"
FLOAT_12 = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
MERGE_TAG = "tag:yaml.org,2002:merge"


class ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader that records every key repeated in one mapping (`duplicates`) instead of keeping the
    last silently."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []  # (line, message), in the order composed

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}  # (tag, text) of a key -> its line
        for key, _value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                continue
            ident, line = (key.tag, key.value), key.start_mark.line + 1
            if ident in seen:
                what = "a merge key '<<'" if key.tag == MERGE_TAG else f"key '{key.value}'"
                fix = (
                    "merge several anchors with one '<<: [*a, *b]'"
                    if key.tag == MERGE_TAG
                    else "delete one of them or merge the two (YAML would silently keep only the last)"
                )
                self.duplicates.append(
                    (
                        line,
                        f"line {line}: {what} appears twice in the same mapping (lines {seen[ident]} and {line}) "
                        f"- {fix}",
                    )
                )
            else:
                seen[ident] = line
        return node


ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_12, list("-+0123456789"))


def _decode(path: Path, raw: bytes) -> str:
    if raw.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise UsageError(
            f"{path} is UTF-16/32 text (it starts with that byte-order mark) - save it as UTF-8, "
            f"e.g. iconv -f UTF-16 -t UTF-8 {path.name} > lpx.yaml"
        )
    if b"\x00" in raw:
        raise UsageError(
            f"{path} is a binary file (it holds NUL bytes), not YAML text - pass your lpx.yaml with -c; {START}"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UsageError(
            f"{path}: line {line} is not UTF-8 (byte 0x{raw[exc.start]:02x}) - save the file as UTF-8 "
            "(an editor's 'encoding' setting, or iconv -f LATIN1 -t UTF-8)"
        ) from None


def _syntax_error(path: Path, exc: yaml.YAMLError, text: str) -> UsageError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text[: exc.position].count("\n") + 1
        return UsageError(
            f"{path}: not valid YAML (line {line}): it holds the control character #x{exc.character:04x} - "
            "delete it (YAML text cannot hold control characters)"
        )
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    if "'\\t'" in problem:
        fix = "YAML indents with spaces only: replace the tab with spaces"
    elif "constructor for the tag" in problem:
        fix = "lpx.yaml is plain YAML: remove the '!' tag"
    else:
        fix = (
            "fix the YAML there (often: uneven indentation, an unclosed quote or bracket, or a missing ': ')"
        )
    return UsageError(f"{path}: not valid YAML{where}: {problem} - {fix}")


def _shape(path: Path, data: object) -> dict:
    if data is None:
        raise UsageError(
            f"{path} is empty (or only comments) - write at least the model and variants sections; {START}"
        )
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({type(data).__name__})"
        raise UsageError(
            f"{path}: the top level is {kind}, not a mapping - lpx.yaml is `key: value` lines "
            f"(model:, variants:, build:, ...) at the left margin; {START}"
        )
    return data


def read_config_file(path: Path) -> dict:
    """The top-level mapping of the YAML file at `path`, or the error that names what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a folder - pass the config file in it, e.g. -c {path / 'lpx.yaml'}")
    if not path.is_file():
        raise UsageError(f"No config file at {path} - create one with 'lpx init DIR' or pass -c FILE")
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise UsageError(
                f"{path} is {size / 2**20:.1f} MiB; an lpx.yaml is a few KiB (at most {MAX_BYTES // 2**20} MiB) "
                "- pass the config file with -c, not a checkpoint or data file"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"Cannot read {path}: {exc.strerror} - check its permissions") from None
    text = _decode(path, raw)
    try:
        loader = ConfigLoader(text)  # the reader refuses control characters here already
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise _syntax_error(path, exc, text) from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply to be an lpx.yaml - check the file") from None
    if loader.duplicates:
        raise ConfigError([message for _, message in sorted(loader.duplicates)], str(path))
    return _shape(path, data)
