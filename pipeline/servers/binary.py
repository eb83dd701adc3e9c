"""Finding `tritonserver` and making the one in the nvidia-pytriton wheel runnable.

Looked for on PATH, then at the NGC container's /opt/tritonserver, then in the nvidia-pytriton wheel
(site-packages/pytriton/tritonserver). The wheel's server needs three things this module provides
(docs/architecture.md has why): a private copy of its backends folder with the python backend stub that
matches this Python, the venv first on PATH (the stub finds its environment through `python3`), and the
matching libpython plus the wheel's own libraries on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from ..artifacts import home
from ..errors import NotFound, UsageError

CONTAINER_BIN = Path("/opt/tritonserver/bin/tritonserver")
INSTALL_FIX = (
    "install it with \"pip install 'lpx[triton]'\" or run LPX inside the NGC Triton TensorRT-LLM container"
)


def bundled_root() -> Path | None:
    """`site-packages/pytriton/tritonserver` of the nvidia-pytriton wheel, if installed."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


def find_tritonserver() -> Path:
    """The tritonserver binary: PATH, then the NGC container's, then nvidia-pytriton's."""
    found = shutil.which("tritonserver")
    if found:
        return Path(found)
    if CONTAINER_BIN.is_file():
        return CONTAINER_BIN
    root = bundled_root()
    if root is not None:
        return root / "bin" / "tritonserver"
    raise NotFound(
        f"tritonserver not found (looked in PATH, {CONTAINER_BIN}, nvidia-pytriton): {INSTALL_FIX}"
    )


def is_bundled(binary: Path) -> Path | None:
    """The wheel's tritonserver folder if `binary` is the one bundled in nvidia-pytriton."""
    root = binary.resolve().parent.parent
    if root.name == "tritonserver" and root.parent.name == "pytriton" and (root / "backends").is_dir():
        return root
    return None


def private_backends(root: Path) -> Path:
    """Copy the wheel's backends once into LPX_HOME, with this Python's stub beside the backend."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        raise UsageError(f"nvidia-pytriton has no python backend stub for Python {ver}: use Python 3.8-3.13")
    st = stub.stat()
    key = hashlib.sha256(f"{root.resolve()}|{ver}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    dest = home() / "triton" / f"backends-{key}"
    if (dest / "python" / "triton_python_backend_stub").is_file():
        return dest
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(root / "backends", tmp, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
    try:
        os.rename(tmp, dest)
    except OSError:  # another process won the race: its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def bundled_env(root: Path) -> dict[str, str]:
    """Environment for the wheel's server: venv first on PATH, matching libpython + bundled libs."""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", "")]).rstrip(os.pathsep)
    libs = [str(sysconfig.get_config_var("LIBDIR") or ""), str(root.parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([p for p in libs + [env.get("LD_LIBRARY_PATH", "")] if p])
    return env
