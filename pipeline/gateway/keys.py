"""API keys: stored as SHA-256 hashes with a key id, never as secrets.

The file (default `$LPX_HOME/gateway/keys.json`, mode 0600, replaced atomically) is a JSON object
{"keys": [{"id", "name", "sha256", "created", "requests_per_minute", "tokens_per_minute"}]}. `add` returns
the secret once (`lpx keys add` prints it); only its hash is kept. A presented key is hashed and compared
with every stored hash by `hmac.compare_digest`. Once the file holds a key, every request needs one; with
no file or no key the gateway is open (bound to 127.0.0.1 unless told otherwise) and says so at start.
The gateway re-reads the file when it changes, so keys added or revoked apply without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..artifacts import home
from ..errors import NotFound, UsageError

PREFIX = "lpx-"
ANONYMOUS = "anonymous"


def default_path() -> Path:
    return home() / "gateway" / "keys.json"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass
class Key:
    id: str
    name: str
    sha256: str
    created: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def public(self) -> dict:
        """What `lpx keys list` shows: everything but the hash."""
        return {k: v for k, v in self.__dict__.items() if k != "sha256"}


def read_keys(path: Path) -> list[Key]:
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [Key(**entry) for entry in data.get("keys", [])]
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{path} is not a valid keys file ({exc}) - fix or remove it, then add keys with 'lpx keys add'"
        ) from None


def write_keys(path: Path, keys: list[Key]) -> None:
    """Replace the file atomically (a temporary file in the same folder, renamed), mode 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".keys-", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"keys": [k.__dict__ for k in keys]}, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_key(
    path: Path, name: str = "", requests_per_minute: int | None = None, tokens_per_minute: int | None = None
) -> tuple[Key, str]:
    """A new key: (its record, the secret - shown once, never stored)."""
    keys = read_keys(path)
    taken = {k.id for k in keys}
    key_id = next(i for i in (f"key-{secrets.token_hex(4)}" for _ in range(100)) if i not in taken)
    secret = PREFIX + secrets.token_urlsafe(32)
    key = Key(
        key_id,
        name,
        digest(secret),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        requests_per_minute,
        tokens_per_minute,
    )
    write_keys(path, [*keys, key])
    return key, secret


def revoke_key(path: Path, key_id: str) -> Key:
    keys = read_keys(path)
    kept = [k for k in keys if k.id != key_id]
    if len(kept) == len(keys):
        known = ", ".join(k.id for k in keys) or "none"
        raise NotFound(f"No key '{key_id}' in {path} (keys: {known}) - 'lpx keys list' shows them")
    write_keys(path, kept)
    return next(k for k in keys if k.id == key_id)


class KeyRing:
    """The gateway's view of the keys file, re-read when its modification time changes (checked at most
    once a second)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._keys: list[Key] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self.reload()

    def reload(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._keys = read_keys(self.path) if stamp else []
            self._stamp = stamp

    def keys(self) -> list[Key]:
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._checked = now
            try:
                self.reload()
            except UsageError:
                pass  # a half-edited file by hand: keep the keys read before
        return self._keys

    @property
    def required(self) -> bool:
        return bool(self.keys())

    def find(self, secret: str) -> Key | None:
        """The key whose hash matches `secret` (every stored hash compared, in constant time each)."""
        presented = digest(secret)
        found = None
        for key in self.keys():
            if hmac.compare_digest(presented, key.sha256):
                found = key
        return found
