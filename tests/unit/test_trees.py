"""Trees a run made, removed and walked by descriptor: any depth, no symlink followed (zygote/trees.py)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from verl_sf.executor.state_dir import LOCK, PREFIX, sweep_stale
from verl_sf.executor.zygote.trees import remove_tree, walk

DEPTH = 2100  # past Python's recursion limit (1,000) and PATH_MAX (4,096 bytes of "d/")


def chain(top: Path, depth: int = DEPTH) -> None:
    """A `mkdir d; cd d` chain with a file, a symlink out and an unreadable directory at the bottom."""
    here = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=here)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=here)
        os.close(here)
        here = inner
    os.close(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=here))
    os.symlink(str(top.parent / "outside"), "out", dir_fd=here)
    os.mkdir("shut", 0, dir_fd=here)
    os.close(here)


def test_a_chain_past_the_recursion_limit_and_path_max_is_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("mine")
    top = tmp_path / "run"
    top.mkdir()
    chain(top)
    remove_tree(str(top))
    assert not top.exists()
    assert (outside / "kept").read_text() == "mine"  # the symlink went, not what it named
    remove_tree(str(top))  # gone already: nothing to do


def test_a_symlink_given_as_the_tree_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        remove_tree(str(tmp_path / "link"))
    assert (tmp_path / "target").is_dir()


def test_walk_visits_every_entry_once_with_one_directory_open(tmp_path: Path) -> None:
    top = tmp_path / "run"
    top.mkdir()
    chain(top, 50)
    (top / "wide").mkdir()
    for index in range(200):
        (top / "wide" / str(index)).touch()
    entered: list[str] = []
    left: list[str] = []
    before = len(os.listdir("/proc/self/fd"))
    opened: list[int] = []

    def enter(directory: int, name: str) -> bool:
        entered.append(name)
        opened.append(len(os.listdir("/proc/self/fd")))
        return name in ("d", "wide")

    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk(fd, enter, lambda directory, name: left.append(name))
    finally:
        os.close(fd)
    assert sorted(entered) == sorted(["d"] * 50 + ["bottom", "out", "shut", "wide"] + [str(i) for i in range(200)])
    assert sorted(left) == sorted(["d"] * 50 + ["wide"])
    assert max(opened) <= before + 3  # `top`, the directory walked, and listdir's own while it lists


def test_a_dead_servers_directory_holding_a_deep_tree_is_swept(tmp_path: Path) -> None:
    dead = tmp_path / f"{PREFIX}dead"
    (dead / "run-1").mkdir(parents=True)
    (dead / LOCK).touch()
    chain(dead / "run-1")
    alive = tmp_path / f"{PREFIX}alive"
    alive.mkdir()
    lock = os.open(alive / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        sweep_stale(str(tmp_path))
        assert not dead.exists() and alive.is_dir()
    finally:
        os.close(lock)
