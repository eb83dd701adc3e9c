"""Delivery of the model repositories into a pod: CI's lpx-repos.tgz streamed by an init container into a
models emptyDir sized from the package (deploy.repository.url / sha256 / size), or a PVC (k8s.pod_spec)."""

from __future__ import annotations

import re
from typing import Any

from ..config import Config
from ..errors import UsageError

FETCH_IMAGE = "docker.io/curlimages/curl:8.11.1"  # curl + busybox tar/sha256sum, runs as non-root (uid 100)


# The init container streams lpx-repos.tgz into the models volume: the checksum is taken on the same stream
# (a fifo into sha256sum), the files land in a hidden folder and move into place only when it matches, so
# a corrupt or partial download leaves nothing `lpx serve --repo /models` would pick up. No tarball copy:
# the volume holds the unpacked repositories only. POSIX sh (busybox in the curl image, dash here).
FETCH_SCRIPT = """set -eu
rm -rf /models/.incoming /tmp/repos.fifo
mkdir /models/.incoming
mkfifo /tmp/repos.fifo
sha256sum < /tmp/repos.fifo > /tmp/repos.sha256 &
curl -fsSL --retry 5 "$REPOS_URL" | tee /tmp/repos.fifo | tar -xzf - -C /models/.incoming
wait $!
got=$(cut -d' ' -f1 /tmp/repos.sha256)
if [ "$got" != "$REPOS_SHA256" ]; then
  rm -rf /models/.incoming
  echo "lpx-repos.tgz has sha256 $got, not $REPOS_SHA256 (deploy.repository.sha256): a corrupt download," \
    "or the tarball was replaced - set sha256 from the new lpx-repos.tgz.sha256" >&2
  exit 1
fi
rm -rf /models/artifacts
mv /models/.incoming/* /models/
rmdir /models/.incoming
"""


def quantity_bytes(q: str) -> int:
    """'12Gi' -> bytes (binary and decimal suffixes, as Kubernetes reads them)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i?)?", q)
    if not m:
        raise UsageError(f"'{q}' is not a size - write it as Kubernetes does, e.g. 12Gi or 800Mi")
    unit = m.group(2) or ""
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    scale.update({f"{k}i": 1024 ** (i + 1) for i, k in enumerate("KMGT")})
    return int(float(m.group(1)) * scale[unit])


def models_size(cfg: Config) -> str | None:
    """The models emptyDir's limit: the unpacked repositories (deploy.repository.size) + 10 %, in Mi."""
    size = cfg.deploy.repository.size
    if size is None:
        return None
    return f"{-(-quantity_bytes(size) * 11 // 10) // 2**20 + 1}Mi"


def fetch_container(cfg: Config, security: dict[str, Any]) -> dict[str, Any]:
    """Init container: stream CI's lpx-repos.tgz into the models volume, checking its sha256 on the way."""
    r = cfg.deploy.repository
    resources = {"cpu": "1", "memory": "512Mi", "ephemeral-storage": models_size(cfg)}
    return {
        "name": "fetch-repository",
        "image": FETCH_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", FETCH_SCRIPT],
        "env": [{"name": "REPOS_URL", "value": r.url}, {"name": "REPOS_SHA256", "value": r.sha256}],
        "resources": {"requests": resources, "limits": dict(resources)},
        "securityContext": security,
        "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}],
    }
