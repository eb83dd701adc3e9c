"""Validate a custom resource offline against a CRD's pinned openAPIV3Schema (tests/contracts/crds/), as the
API server's structural-schema validation does, strictly: a field the schema does not declare is an
error unless the schema preserves unknown fields there (kubectl's --validate=strict).

Covers what the pinned schemas use: type, enum, required, properties, additionalProperties, items,
x-kubernetes-preserve-unknown-fields, x-kubernetes-int-or-string, minimum/maximum, minItems/maxItems,
minLength/maxLength, pattern, anyOf/oneOf/allOf. CEL rules (x-kubernetes-validations) and admission
webhooks are not evaluated; they need the operator itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CRDS = Path(__file__).parent / "contracts" / "crds"
FILES = {
    "DynamoGraphDeployment": "dynamographdeployment.json",
    "LeaderWorkerSet": "leaderworkerset.json",
    "ServiceMonitor": "servicemonitor.json",
    "PodMonitor": "podmonitor.json",
    "PrometheusRule": "prometheusrule.json",
}
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def schema_for(obj: dict, file: str | None = None) -> dict:
    """The pinned schema of `obj`'s kind at its apiVersion (a KeyError names what is missing)."""
    pinned = json.loads((CRDS / (file or FILES[obj["kind"]])).read_text())
    group, _, version = obj["apiVersion"].rpartition("/")
    assert group == pinned["group"], (group, pinned["group"])
    return pinned["versions"][version]


def errors(value: Any, schema: dict, path: str = "") -> list[str]:
    """Every way `value` breaks `schema` (empty: valid)."""
    out: list[str] = []
    where = path or "(root)"
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            out.append(f"{where}: expected int or string, got {type(value).__name__}")
        return out
    kind = schema.get("type")
    if kind:
        expected = TYPES[kind]
        if not isinstance(value, expected) or (kind in ("integer", "number") and isinstance(value, bool)):
            return [f"{where}: expected {kind}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} not in {schema['enum']}")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            passing = [s for s in schema[key] if not errors(value, {**s, "type": s.get("type", kind)}, path)]
            if not passing:
                out.append(f"{where}: matches none of {key}")
    for sub in schema.get("allOf", []):
        out += errors(value, sub, path)
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{where}: {value!r} does not match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 62):
            out.append(f"{where}: length {len(value)} out of bounds")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{where}: {value} below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{where}: {value} above {schema['maximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1 << 62):
            out.append(f"{where}: {len(value)} items out of bounds")
        for i, item in enumerate(value):
            out += errors(item, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for name in schema.get("required", []):
            if name not in value:
                out.append(f"{where}: missing required {name!r}")
        for name, item in value.items():
            sub = f"{path}.{name}" if path else name
            if name in props:
                out += errors(item, props[name], sub)
            elif isinstance(extra, dict):
                out += errors(item, extra, sub)
            elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                continue
            elif props or extra is False or kind == "object":
                out.append(f"{sub}: unknown field")
    return out


def validate(obj: dict, file: str | None = None) -> list[str]:
    """Errors of a whole custom resource: apiVersion/kind/metadata as the API server reads them, the rest
    against the pinned schema."""
    schema = schema_for(obj, file)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    props = {
        k: v for k, v in schema.get("properties", {}).items() if k not in ("apiVersion", "kind", "metadata")
    }
    problems = errors(body, {**schema, "properties": props})
    name = obj.get("metadata", {}).get("name", "")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name):
        problems.append(f"metadata.name {name!r} is not a DNS subdomain")
    return problems
