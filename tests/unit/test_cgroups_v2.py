"""cgroup v2 paths over a fake tree (this machine is cgroup v1 only): the server's groups at the
top of the tree when it may write there, else in its own delegated subtree; run groups' limits
and whose cap a memory kill was.  The kernel's own behaviour on a real v2 host is not tested here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from verl_sf.executor.cgroups import CgroupManager
from verl_sf.executor.zygote.messages import Limits
from verl_sf.executor.zygote.run_groups import RunGroups


def _unified(root: Path) -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_as_root_the_servers_group_goes_at_the_top(tmp_path: Path) -> None:
    root = _unified(tmp_path / "cg")
    manager = CgroupManager("verl-sf-1-x", memory_cap_bytes=1 << 30, root=root, own_group="/user.slice")
    assert manager.available and manager.v2, manager.reason
    parent = root / "verl-sf-1-x"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (parent / "memory.max").read_text() == str(1 << 30)
    sandbox = manager.sandbox("stdlib-0")
    assert sandbox is not None and set(sandbox.dirs.values()) == {str(parent / "stdlib-0")}
    assert sandbox.cpu_counter == "memory"  # the zygote reads each run's CPU in its group's cpu.stat
    if os.geteuid() == 0:  # delegation chowns to the sandbox's uid (and its gid, which only root may give)
        sandbox.delegate(100000)
        assert (parent / "stdlib-0").stat().st_uid == 100000
        group = parent / "stdlib-0"
        (group / "cgroup.subtree_control").write_text("")  # what the kernel makes with a group
        sandbox.prepare()  # a fresh group hands nothing down: the sandbox's first process may join it
        assert (group / "cgroup.subtree_control").read_text() == ""
        # Up: bubblewrap's processes join the leaf the zygote moved to, then the group hands controllers down.
        (group / "zygote").mkdir()
        (group / "cgroup.procs").write_text("301\n302\n")
        early = group / "run-1"  # a run group the zygote made before the controllers came down
        early.mkdir()
        os.chown(early, 100000, 100000)
        (early / "memory.max").write_text("max\n")  # the kernel's, owned by root
        sandbox.settle()
        assert (early / "memory.max").stat().st_uid == 100000  # the zygote can cap that run
        assert (group / "zygote" / "cgroup.procs").read_text() == "302"  # a real cgroup.procs takes each write
        assert (group / "cgroup.subtree_control").read_text() == "+memory +pids"
        sandbox.prepare()  # a restart: the group stops handing down first (v2 keeps processes out otherwise)
        assert (group / "cgroup.subtree_control").read_text() == "-memory -pids"
    (parent / "memory.current").write_text("12345\n")
    assert manager.memory_usage() == 12345


def test_without_root_it_uses_the_delegated_subtree_and_leaves_it_first(tmp_path: Path) -> None:
    root = _unified(tmp_path / "cg")
    own = root / "user.slice" / "run-1.scope"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text("")
    (own / "cgroup.procs").write_text("4242\n")
    os.chmod(root / "cgroup.subtree_control", 0o444)  # the top is not ours
    try:
        manager = CgroupManager("verl-sf-2-x", root=root, own_group="/user.slice/run-1.scope")
        if os.geteuid() == 0:  # root writes anyway: the top of the tree is the base, as on a real host
            assert (root / "verl-sf-2-x").is_dir()
            return
        assert manager.available, manager.reason
        assert (own / "verl-sf-server" / "cgroup.procs").read_text() == "4242"  # the server moved to a leaf
        assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"
        assert (own / "verl-sf-2-x" / "cgroup.subtree_control").read_text() == "+memory +pids"
    finally:
        os.chmod(root / "cgroup.subtree_control", 0o644)


def test_without_root_or_delegation_it_says_so(tmp_path: Path) -> None:
    root = _unified(tmp_path / "cg")
    (root / "user.slice").mkdir()
    os.chmod(root / "cgroup.subtree_control", 0o444)
    try:
        manager = CgroupManager("verl-sf-3-x", root=root, own_group="/user.slice")
        if os.geteuid() != 0:
            assert not manager.available and "delegated" in manager.reason
    finally:
        os.chmod(root / "cgroup.subtree_control", 0o644)


LIMITS: Limits = {"timeout": 1.0, "hard_timeout": 2.0, "output_limit": 1024, "memory": 64 << 20, "nproc": 8}


@pytest.fixture
def delegated(tmp_path: Path) -> int:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    return fd


def test_run_groups_under_v2_write_memory_max_and_read_memory_events(delegated: int) -> None:
    groups = RunGroups({"cgroups": {"memory": delegated, "pids": delegated}, "cgroup_v2": True, "cpu_counter": "memory", "group_prefix": ""})  # type: ignore[typeddict-item]
    # Before it forks anything the zygote moves to its leaf (a group that hands controllers down holds no process).
    assert Path(f"/proc/self/fd/{delegated}/zygote/cgroup.procs").read_text() == "0"
    made = groups.make(1)
    assert made["memory"] == made["pids"]  # one unified group
    groups.set_limits(made, LIMITS)
    base = Path(f"/proc/self/fd/{delegated}/run-1")
    assert (base / "memory.max").read_text() == str(64 << 20)
    assert (base / "pids.max").read_text() == str(8 + 8)
    (base / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n")
    assert groups.memory_kill(made) == "shared"
    (base / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert groups.memory_kill(made) == "own"
    os.close(delegated)


def test_run_groups_under_v2_count_a_jobs_cpu_in_its_groups_cpu_stat(delegated: int) -> None:
    """Every v2 group has cpu.stat: a job's CPU, its processes gone included, since its group was taken."""
    Path(f"/proc/self/fd/{delegated}/cpu.stat").write_text("usage_usec 0\n")
    groups = RunGroups({"cgroups": {"memory": delegated, "pids": delegated}, "cgroup_v2": True, "cpu_counter": "memory", "group_prefix": ""})  # type: ignore[typeddict-item]
    made = groups.make(1)
    stat = Path(f"/proc/self/fd/{delegated}/run-1/cpu.stat")
    stat.write_text("usage_usec 250000\nuser_usec 200000\nsystem_usec 50000\n")
    assert groups.cpu_used(made) == pytest.approx(0.25)
    groups.release(made, killed_for_memory=False)
    reused = groups.make(2)
    assert reused == made
    stat.write_text("usage_usec 400000\nuser_usec 300000\nsystem_usec 100000\n")
    assert groups.cpu_used(reused) == pytest.approx(0.15)  # what its earlier job used is not its own
    os.close(delegated)


def test_run_groups_without_a_counter_say_so(delegated: int) -> None:
    groups = RunGroups({"cgroups": {"memory": delegated, "pids": delegated}, "cgroup_v2": True, "cpu_counter": "", "group_prefix": ""})  # type: ignore[typeddict-item]
    assert groups.cpu_used(groups.make(1)) is None
    os.close(delegated)
