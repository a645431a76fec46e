"""The zygote package without a sandbox: what it imports, its wire format, its path safety and
its cgroup bookkeeping (over a directory standing in for a delegated cgroup)."""

from __future__ import annotations

import ast
import base64
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_sf.executor.zygote import paths, wire
from verl_sf.executor.zygote.messages import Limits
from verl_sf.executor.zygote.run_groups import RunGroups

PACKAGE = Path(__file__).resolve().parents[2] / "verl_sf" / "executor" / "zygote"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(level, module) of every import statement in a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name
        elif isinstance(node, ast.ImportFrom):
            yield node.level, node.module or ""


CELLS_LIBRARIES = {"IPython", "traitlets"}  # the runtime's own, imported where a cells interpreter warms up


def test_the_zygote_imports_only_the_standard_library_and_itself() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 10
    for module in modules:
        for level, name in _imports(module):
            top = name.split(".")[0]
            if top in CELLS_LIBRARIES and module.name == "ipython_shell.py":
                continue
            assert level > 0 or top in sys.stdlib_module_names or top == "__future__", \
                f"{module.name} imports {name}, which the sandbox does not have"


def test_ipython_is_imported_only_inside_a_function() -> None:
    """Every zygote imports ipython_shell; only a cells flavor's warm-up (or a session's first cell) calls
    into it and pays for IPython."""
    tree = ast.parse((PACKAGE / "ipython_shell.py").read_text())
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    named = {alias.name.split(".")[0] for node in top_level for alias in node.names} | \
        {(node.module or "").split(".")[0] for node in top_level if isinstance(node, ast.ImportFrom)}
    assert not named & CELLS_LIBRARIES
    assert {name.split(".")[0] for _, name in _imports(PACKAGE / "ipython_shell.py")} & CELLS_LIBRARIES


def test_lines_are_split_across_chunks_and_scanned_once() -> None:
    lines = wire.Lines()
    assert lines.feed(b'{"a"') == []
    assert lines.feed(b': 1}\n{"b": 2}\n{"c"') == [b'{"a": 1}', b'{"b": 2}']
    assert len(lines) == 4 and lines.scanned == 4
    assert lines.feed(b": 3}\n") == [b'{"c": 3}']
    assert len(lines) == 0


def test_loads_is_strict_and_dumps_is_compact() -> None:
    assert wire.loads(' {"x": [1, 2]} ') == {"x": [1, 2]}
    for bad in ("", "{} {}", "{", "nope"):
        with pytest.raises(ValueError):
            wire.loads(bad)
    assert wire.dumps({"k": "é", "n": None}) == b'{"k":"\\u00e9","n":null}'


def test_paths_are_split_beneath_their_roots() -> None:
    roots = ["/workdir", "/tmp", "/mnt"]
    assert paths.split_path("a/b.txt", roots) == ("/workdir", ["a", "b.txt"])
    assert paths.split_path("/mnt/data/p.png", roots) == ("/mnt", ["data", "p.png"])
    assert paths.split_path("./x//y", roots) == ("/workdir", ["x", "y"])
    for bad in ("/etc/passwd", "a/../../etc", "", "/tmp", "x\x00y", "/workdirx/a"):
        with pytest.raises(ValueError):
            paths.split_path(bad, roots)


def test_files_are_written_and_fetched_without_following_symlinks() -> None:
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as outside:
        Path(outside, "secret").write_text("host secret")
        os.symlink(outside, f"{root}/link")
        os.symlink(f"{outside}/secret", f"{root}/file-link")
        paths.write_files({"d/in.txt": base64.b64encode(b"data").decode()}, [root])
        assert Path(root, "d", "in.txt").read_bytes() == b"data"
        with pytest.raises(paths.UnwritableFile, match="link/planted"):
            paths.write_files({"link/planted": ""}, [root])
        assert not Path(outside, "planted").exists()
        fetched = paths.fetch(["d/in.txt", "./d/in.txt", f"{root}/d/in.txt", "link/secret", "file-link", "nope"],
                              [root], 1 << 20)
        assert fetched == {"d/in.txt": base64.b64encode(b"data").decode()}


def test_fetch_stays_within_its_limit_over_all_files() -> None:
    with tempfile.TemporaryDirectory() as root:
        for name in ("a", "b", "c"):
            Path(root, name).write_bytes(b"x" * 400)
        assert sorted(paths.fetch(["a", "b", "c"], [root], 1000)) == ["a", "b"]


LIMITS: Limits = {"timeout": 1.0, "hard_timeout": 2.0, "output_limit": 1024, "memory": 64 << 20, "nproc": 8}


@pytest.fixture
def delegated() -> Iterator[int]:
    """A directory standing in for a delegated cgroup v1 directory, as a descriptor."""
    with tempfile.TemporaryDirectory() as directory:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        yield fd
        os.close(fd)


def _groups(fd: int) -> RunGroups:
    groups = RunGroups({"cgroups": {"memory": fd, "pids": fd}, "cgroup_v2": False, "cpu_counter": "", "group_prefix": ""})  # type: ignore[typeddict-item]
    return groups


def test_limits_are_written_once_and_rewritten_when_they_change(delegated: int) -> None:
    groups = _groups(delegated)
    made = groups.make(1)
    limit_file = Path(f"/proc/self/fd/{delegated}/run-1/memory.limit_in_bytes")
    groups.set_limits(made, LIMITS)
    assert limit_file.read_text() == str(64 << 20)
    limit_file.write_text("tampered")
    groups.set_limits(made, LIMITS)  # unchanged: not written again
    assert limit_file.read_text() == "tampered"
    groups.set_limits(made, {**LIMITS, "memory": 32 << 20})
    assert limit_file.read_text() == str(32 << 20)


def test_a_cap_that_cannot_be_written_is_an_error_and_not_remembered(delegated: int) -> None:
    groups = _groups(delegated)
    made = groups.make(2)
    # Opens, then refuses the value (as the kernel refuses a limit below the group's usage).
    os.symlink("/dev/full", f"/proc/self/fd/{delegated}/run-2/memory.limit_in_bytes")
    with pytest.raises(OSError):
        groups.set_limits(made, LIMITS)
    os.unlink(f"/proc/self/fd/{delegated}/run-2/memory.limit_in_bytes")
    groups.set_limits(made, LIMITS)  # written now: the failure was not recorded as a success
    assert Path(f"/proc/self/fd/{delegated}/run-2/memory.limit_in_bytes").read_text() == str(64 << 20)


def test_memory_kills_name_whose_cap(delegated: int) -> None:
    groups = _groups(delegated)
    made = groups.make(3)
    base = f"/proc/self/fd/{delegated}/run-3"
    Path(base, "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert groups.memory_kill(made) is None
    Path(base, "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    Path(base, "memory.failcnt").write_text("0\n")
    assert groups.memory_kill(made) == "shared"
    Path(base, "memory.failcnt").write_text("12\n")
    assert groups.memory_kill(made) == "own"
    groups.release(made, killed_for_memory=False)
    assert Path(base, "memory.failcnt").read_text() == "0"  # reset for the group's next job
    assert groups.make(4) is made  # reused


def test_directory_size_counts_files_and_never_follows_a_symlink(tmp_path: Path) -> None:
    from verl_sf.executor.zygote.procfs import directory_size

    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "sub" / "f").write_bytes(b"x" * (1 << 20))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * (8 << 20))
    (run / "link").symlink_to(outside)
    size = directory_size(str(run), 1 << 30, 10 ** 6).size
    assert (1 << 20) <= size < (2 << 20)  # the 8 MB behind the symlink is not counted
