"""API keys: stored as SHA-256 hashes with a key id, never as secrets.

The file (default `$LPX_HOME/gateway/keys.json`, mode 0600, replaced atomically) is a JSON object
{"keys": [{"id", "name", "sha256", "created", "requests_per_minute", "tokens_per_minute"}]}. `add` returns
the secret once (`lpx keys add` prints it); only its hash is kept. A presented key is hashed and compared
with every stored hash by `hmac.compare_digest`. Once the file holds a key, every request needs one; with
no file or no key the gateway is open (bound to 127.0.0.1 unless told otherwise) and says so at start.
The gateway re-reads the file when it changes, so keys added or revoked apply without a restart; a file
that goes missing or cannot be read makes it refuse every request (KeyRing), never opens it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from ..artifacts import home
from ..atomic import write_atomic
from ..errors import NotFound, UsageError

log = logging.getLogger("lpx.gateway")
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
        return _parse(path)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{path} is not a valid keys file ({exc}) - fix or remove it, then add keys with 'lpx keys add'"
        ) from None


def _parse(path: Path) -> list[Key]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [Key(**entry) for entry in data.get("keys", [])]


def write_keys(path: Path, keys: list[Key]) -> None:
    """Replace the file atomically (a temporary file in the same folder, renamed), mode 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = json.dumps({"keys": [k.__dict__ for k in keys]}, indent=2) + "\n"
    write_atomic(path, text, mode=0o600)


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
    """The gateway's view of the keys file, re-read when its modification time or size changes (checked
    at most once a second).

    It fails closed: once the file has held a key in this process, a file that goes missing, and at any
    time a file that cannot be read or parsed, makes the ring `broken` - every request is refused (401)
    until the file is readable again - and that is logged once per change, naming the file. A corrupt file
    does not keep the last keys read: a hand edit meant to revoke a leaked key that broke the JSON must not
    leave that key working; `lpx keys` writes atomically, so it never leaves such a file. Only a file that
    never existed in this process (or holds no key) leaves the gateway open, as documented.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._keys: list[Key] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._seen_keys = False
        self.broken: str | None = None  # why the file cannot be used now; None when it can
        self.reload(strict=True)

    def reload(self, strict: bool = False) -> None:
        """Re-read the file if it changed. `strict` (at start): an unreadable file raises UsageError."""
        try:
            st = self.path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            if strict:
                raise UsageError(
                    f"{self.path} cannot be read ({exc.strerror}) - fix its folder's permissions"
                ) from None
            self._fail(f"cannot be read ({exc.strerror})")
            return
        if stamp == self._stamp and self.broken is None:
            return
        if stamp is None:
            self._stamp, self._keys = None, []
            if self._seen_keys:
                self._fail("is missing")
            else:
                self._ok()
            return
        if strict:
            keys = read_keys(self.path)  # at start: a clear UsageError, the gateway does not start
        else:
            try:
                keys = _parse(self.path)
            except FileNotFoundError:  # removed between the stat and the read
                self._stamp = None
                if self._seen_keys:
                    self._fail("is missing")
                else:
                    self._ok()
                return
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                self._fail(f"is not a valid keys file ({exc})")
                return
        self._stamp, self._keys = stamp, keys
        self._seen_keys = self._seen_keys or bool(keys)
        self._ok()

    def _fail(self, why: str) -> None:
        self._keys = []
        if why != self.broken:
            log.error(
                "the API keys file %s %s - every request is refused (401) until it is restored",
                self.path,
                why,
            )
        self.broken = why

    def _ok(self) -> None:
        if self.broken is not None:
            log.warning("the API keys file %s is readable again (%d key(s))", self.path, len(self._keys))
        self.broken = None

    def keys(self) -> list[Key]:
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._checked = now
            self.reload()
        return self._keys

    @property
    def required(self) -> bool:
        """Whether a request needs a key (also true while the file is broken: nobody gets in then)."""
        return bool(self.keys()) or self.broken is not None

    def find(self, secret: str) -> Key | None:
        """The key whose hash matches `secret` (every stored hash compared, in constant time each)."""
        presented = digest(secret)
        found = None
        for key in self.keys():
            if hmac.compare_digest(presented, key.sha256):
                found = key
        return found
