"""Trees a run made, removed and walked by descriptor: any depth, no symlink followed (zygote/trees.py)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from verl_sf.executor.state_dir import LOCK, PREFIX, sweep_stale
from verl_sf.executor.zygote.procfs import directory_size
from verl_sf.executor.zygote.trees import DIRECTORY, TreeMoved, remove_tree, walk

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

    def enter(directory: int, name: str) -> Optional[int]:
        entered.append(name)
        opened.append(len(os.listdir("/proc/self/fd")))
        return os.open(name, DIRECTORY, dir_fd=directory) if name in ("d", "wide") else None

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


def test_a_directory_moved_out_of_the_tree_mid_walk_stops_the_walk(tmp_path: Path) -> None:
    """A live run can move the directory a walk is in: climbing '..' would then leave the tree."""
    top = tmp_path / "run"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").touch()
    (tmp_path / "elsewhere").mkdir()

    def enter(directory: int, name: str) -> Optional[int]:
        if name == "f":
            os.rename(top / "a" / "b", tmp_path / "elsewhere" / "b")
        return os.open(name, DIRECTORY, dir_fd=directory) if name in ("a", "b") else None

    fd = os.open(top, DIRECTORY)
    try:
        with pytest.raises(TreeMoved):
            walk(fd, enter, lambda directory, name: None)
    finally:
        os.close(fd)


def test_a_files_count_takes_every_block_however_wide_and_deep(tmp_path: Path) -> None:
    """The landlock rung's files cap (procfs.directory_size): a count held a descriptor per directory
    not yet visited, so a run's many sibling directories ran the zygote out of them and the rest went
    uncounted.  Counted here under a descriptor limit far below the directories' number."""
    top = tmp_path / "run"
    top.mkdir()
    for index in range(600):
        (top / str(index)).mkdir()
        (top / str(index) / "f").write_bytes(b"x" * 4096)
    chain(top, 1200)
    expected = 600 * (top / "0" / "f").stat().st_blocks * 512  # the chain's own file is empty
    assert expected >= 600 * 4096
    count = (f"import resource, sys\nsys.path[:0] = {sys.path!r}\n"
             "from verl_sf.executor.zygote.procfs import directory_size\n"
             "resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
             f"print(directory_size({str(top)!r}, 1 << 40, 10 ** 6).size)\n")
    counted = subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, timeout=120, check=True)
    assert expected <= int(counted.stdout) <= expected + 8192, counted  # and the chain's symlink
    assert directory_size(str(top), 100 * 4096, 10 ** 6).size > 100 * 4096  # stops once past what it was asked
    assert directory_size(str(top), 1 << 40, 500) == (directory_size(str(top), 1 << 40, 500).size, 501)
    remove_tree(str(top))  # deeper than pytest's own clean-up can recurse


def test_a_counts_opened_up_directory_keeps_a_mode_its_run_set_meanwhile(tmp_path: Path) -> None:
    """Red team, 2026-12-06: a count that opened a directory up for its walk put its mode back over
    one the run had set meanwhile (the run's 0o750 became 0o000 again)."""
    from verl_sf.executor.zygote.procfs import OPENED_UP, _Count

    for changed, expected in ((False, 0o300), (True, 0o750)):
        directory = tmp_path / f"d{changed}"
        directory.mkdir(mode=0o300)
        os.chmod(directory, 0o300)
        handle = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        os.chmod(directory, 0o300 | OPENED_UP)  # as _open_up leaves it
        if changed:
            os.chmod(directory, 0o750)  # the run's own chmod, while the walk was in it
        _Count._put_back((handle, 0o300))
        assert oct(directory.stat().st_mode & 0o777) == oct(expected)
