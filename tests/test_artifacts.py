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
