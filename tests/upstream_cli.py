"""Command lines of containers whose images are upstream's, checked as far as they can be without the image:
every flag is one the program takes (tests/contracts: dynamo_cli.json for Dynamo's components at the
pinned commit, vllm_engine_args.json for the vLLM engine flags Dynamo's vLLM worker passes on,
tritonserver_flags.json for the tritonserver `lpx serve` starts), and every path an argument names lies in
a volume mounted into the container (a ConfigMap's key must exist; a PVC's path is the repository layout
LPX packs)."""

from __future__ import annotations

import json
from pathlib import Path

CONTRACTS = Path(__file__).parent / "contracts"
DYNAMO = json.loads((CONTRACTS / "dynamo_cli.json").read_text())["components"]
VLLM_ARGS = json.loads((CONTRACTS / "vllm_engine_args.json").read_text())["engine_args"]
TRITONSERVER = set(json.loads((CONTRACTS / "tritonserver_flags.json").read_text())["flags"])
PATH_FLAGS = ("--model-path", "--model", "--extra-engine-args")


def vllm_engine_flags() -> set[str]:
    """vLLM's EngineArgs as flags: --name-with-dashes, and --no-<name> for booleans."""
    out = set()
    for name, info in VLLM_ARGS.items():
        flag = "--" + name.replace("_", "-")
        out.add(flag)
        if "bool" in str(info.get("type", "")):
            out.add("--no-" + flag[2:])
    return out


def known_flags(module: str) -> set[str]:
    """The flags `python3 -m <module>` takes."""
    flags = set(DYNAMO[module]["flags"])
    if module == "dynamo.vllm":
        flags |= vllm_engine_flags()
    return flags


def flags_of(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def unknown_flags(module: str, args: list[str]) -> list[str]:
    known = known_flags(module)
    return [f for f in flags_of(args) if f not in known]


def mounted(path: str, container: dict) -> dict | None:
    """The volumeMount that holds `path`, or None."""
    for m in container.get("volumeMounts", []):
        root = m["mountPath"].rstrip("/")
        if path == root or path.startswith(root + "/"):
            return m
    return None


def check_dynamo_container(container: dict, spec: dict, config_maps: dict[str, dict[str, str]]) -> list[str]:
    """Problems with one Dynamo container (a worker's `python3 -m dynamo.<backend>`; the frontend runs the
    image's default command): unknown flags, path arguments outside its mounts, a ConfigMap key that is
    not there."""
    command = container.get("command", [])
    if not command:
        return [] if not container.get("args") else [f"{container['name']}: args without a command"]
    if command[:2] != ["python3", "-m"] or command[2] not in DYNAMO:
        return [f"{container['name']}: {command} is none of {sorted(DYNAMO)}"]
    args = container.get("args", [])
    problems = [f"{command[2]} has no flag {f}" for f in unknown_flags(command[2], args)]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for flag in PATH_FLAGS:
        if flag not in args:
            continue
        path = args[args.index(flag) + 1]
        mount = mounted(path, container)
        if mount is None:
            problems.append(f"{flag} {path} is in no volume mounted into {container['name']}")
            continue
        source = volumes.get(mount["name"], {})
        if "configMap" in source:
            key = path[len(mount["mountPath"].rstrip("/")) + 1 :]
            data = config_maps.get(source["configMap"]["name"], {})
            if key not in data:
                problems.append(f"{flag} {path}: ConfigMap {source['configMap']['name']} has no key {key!r}")
    return problems


def unknown_tritonserver_flags(argv: list[str]) -> list[str]:
    """Flags of every tritonserver in a command (plain, or mpirun's MPMD blocks) the program does not take."""
    out, inside = [], False
    for a in argv:
        if a.endswith("tritonserver"):
            inside = True
        elif a == ":":
            inside = False
        elif inside and a.startswith("--") and a.split("=", 1)[0] not in TRITONSERVER:
            out.append(a.split("=", 1)[0])
    return out
