"""The artifact store: keys, atomic commit, corrupt entries, stale temporary folders."""

from __future__ import annotations

import json
import os

from pipeline.artifacts import Store, read_manifest
from pipeline.cache_keys import explain, make_key


def _commit(store, key, payload="x"):
    slot = store.slot("build", "m", "v", "sm90")
    with store.lock(slot), store.staging(slot, key) as tmp:
        (tmp / "engine.bin").write_text(payload)
        return store.commit(
            tmp,
            slot / key,
            {
                "stage": "build",
                "model": "m",
                "variant": "v",
                "arch": "sm90",
                "created": 1.0,
                "inputs": {"a": 1},
            },
        )


def test_key_is_order_independent_and_input_sensitive():
    assert make_key({"a": 1, "b": [1, 2]}) == make_key({"b": [1, 2], "a": 1})
    assert make_key({"a": 1}) != make_key({"a": 2})
    assert len(make_key({})) == 12


def test_diff_names_nested_changes():
    changes = explain(
        {"build": {"max_batch_size": 8}, "arch": "sm90"},
        {"build": {"max_batch_size": 16}, "arch": "sm90", "new": True},
    )
    assert changes == ["build.max_batch_size: 8 -> 16", "new: <unset> -> true"]


def test_commit_writes_manifest_and_lookup_finds_it(isolated_home):
    store = Store()
    art = _commit(store, "abc123abc123")
    assert art.path == isolated_home / "artifacts" / "engines" / "m" / "v" / "sm90" / "abc123abc123"
    assert (art.path / "engine.bin").read_text() == "x"
    assert store.lookup("build", "m", "v", "sm90", "abc123abc123").manifest["inputs"] == {"a": 1}
    assert not list(art.path.parent.glob(".tmp-*"))


def test_corrupt_or_foreign_manifest_is_a_miss(isolated_home):
    store = Store()
    art = _commit(store, "abc123abc123")
    (art.path / "manifest.json").write_text("{not json")
    assert store.lookup("build", "m", "v", "sm90", "abc123abc123") is None
    assert read_manifest(art.path) is None
    (art.path / "manifest.json").write_text(json.dumps({"schema": 1, "key": "other", "complete": True}))
    assert store.lookup("build", "m", "v", "sm90", "abc123abc123") is None
    # a re-run under the same key replaces the broken entry
    again = _commit(store, "abc123abc123", payload="y")
    assert (again.path / "engine.bin").read_text() == "y"
    assert store.lookup("build", "m", "v", "sm90", "abc123abc123") is not None


def test_folder_without_manifest_is_not_complete(isolated_home):
    store = Store()
    slot = store.slot("build", "m", "v", "sm90")
    (slot / "deadbeef0000").mkdir(parents=True)
    assert store.lookup("build", "m", "v", "sm90", "deadbeef0000") is None
    assert store.entries("build", "m", "v", "sm90") == []


def test_sweep_removes_temp_folders_of_dead_processes(isolated_home):
    store = Store()
    slot = store.slot("build", "m", "v", "sm90")
    dead = slot / ".tmp-abc-999999999"
    dead.mkdir(parents=True)
    alive = slot / f".tmp-abc-{os.getppid()}"
    alive.mkdir()
    store.sweep(slot)
    assert not dead.exists() and alive.exists()


def _private_commit(store, key):
    """A stage whose writer leaves a 0600 file in a 0700 folder (transformers' model.safetensors is 0600)."""
    slot = store.slot("quantize", "m", "v", "any")
    with store.lock(slot), store.staging(slot, key) as tmp:
        (tmp / "hf").mkdir(mode=0o700)
        (tmp / "hf" / "model.safetensors").write_bytes(b"w")
        os.chmod(tmp / "hf" / "model.safetensors", 0o600)
        meta = {
            "stage": "quantize",
            "model": "m",
            "variant": "v",
            "arch": "any",
            "created": 1.0,
            "inputs": {},
        }
        return store.commit(tmp, slot / key, meta)


def test_committed_files_are_readable_as_the_umask_allows(isolated_home):
    # On 2eeb7c6 model.safetensors stayed 0600 through quantize, build and repo (hard links share the inode), so
    # the pods' uid 1000 could not read a repository that CI packed or a PVC holds.
    old = os.umask(0o022)
    try:
        art = _private_commit(Store(), "k1")
    finally:
        os.umask(old)
    assert oct((art.path / "hf" / "model.safetensors").stat().st_mode & 0o777) == "0o644"
    assert oct((art.path / "hf").stat().st_mode & 0o777) == "0o755"
    old = os.umask(0o077)  # a user who keeps their files private keeps them private
    try:
        art = _private_commit(Store(), "k2")
    finally:
        os.umask(old)
    assert oct((art.path / "hf" / "model.safetensors").stat().st_mode & 0o777) == "0o600"
