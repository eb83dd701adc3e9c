"""`atomic.replace_folder`, the one way LPX puts a complete folder in the place of another (the artifact store,
`lpx deploy`'s trees, the demo's and the examples' checkpoints): the old folder is removed only after the new
one is in place, and comes back when the new one cannot take its place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline import atomic


def folder(path: Path, name: str) -> Path:
    path.mkdir()
    (path / name).write_text(name)
    return path


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_the_new_folder_takes_the_old_ones_place(tmp_path: Path, monkeypatch, exchange: bool) -> None:
    if not exchange:  # a filesystem without RENAME_EXCHANGE
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    new, dest, aside = folder(tmp_path / "new", "new"), folder(tmp_path / "dest", "old"), tmp_path / ".aside"
    atomic.replace_folder(new, dest, aside)
    assert sorted(os.listdir(dest)) == ["new"] and not new.exists() and not aside.exists()
    assert sorted(os.listdir(tmp_path)) == ["dest"]


def test_a_first_folder_is_renamed_into_place(tmp_path: Path) -> None:
    atomic.replace_folder(folder(tmp_path / "new", "new"), tmp_path / "dest", tmp_path / ".aside")
    assert sorted(os.listdir(tmp_path / "dest")) == ["new"]


def test_the_exchange_is_one_step_where_the_kernel_has_it(tmp_path: Path) -> None:
    a, b = folder(tmp_path / "a", "A"), folder(tmp_path / "b", "B")
    if not atomic._exchange(a, b):
        pytest.skip("this filesystem has no renameat2 RENAME_EXCHANGE (the two-renames path is tested above)")
    assert os.listdir(a) == ["B"] and os.listdir(b) == ["A"]


def test_the_old_folder_comes_back_when_the_new_one_cannot_take_its_place(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    new, dest, aside = folder(tmp_path / "new", "new"), folder(tmp_path / "dest", "old"), tmp_path / ".aside"
    real = os.rename

    def failing(src, dst):
        if Path(src) == new:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "rename", failing)
    with pytest.raises(OSError):
        atomic.replace_folder(new, dest, aside)
    assert os.listdir(dest) == ["old"] and not aside.exists()


def test_the_demo_checkpoint_survives_a_failed_rewrite(tmp_path: Path, monkeypatch) -> None:
    # On 2eeb7c6 write_checkpoint deleted the old checkpoint before renaming the new one into place.
    from pipeline import demo

    dest = folder(tmp_path / "demo", "config.json")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(demo, "replace_folder", fail)
    monkeypatch.setattr(demo, "_train", lambda *a, **k: None)  # the training is not what is tested
    with pytest.raises(OSError):
        demo.write_checkpoint(dest, train_steps=0)
    assert os.listdir(dest) == ["config.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]  # no staging folder left
