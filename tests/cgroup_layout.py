"""Where this host keeps the memory and pids cgroups: cgroup v2's one tree, or v1's one per controller.

Tests that look for a server's groups read the layout the host has (as the server does) instead
of assuming v1's `/sys/fs/cgroup/<controller>` paths, so they check the same thing on either.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")


def is_v2() -> bool:
    """One unified tree at the root, as the server decides (a hybrid host's empty `unified` mount is v1)."""
    return (CGROUP_ROOT / "cgroup.controllers").exists()


def v1_mounts() -> dict[str, Path]:
    """controller -> where its v1 hierarchy is mounted, from /proc/self/mountinfo."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        fstype, _, options = (tail.split() + ["", "", ""])[:3]
        if fstype == "cgroup":
            for option in options.split(","):
                mounts.setdefault(option, Path(fields.split()[4]))
    return mounts


def controller_dirs() -> dict[str, Path]:
    """memory and pids -> the directory their groups are made in (the same one under v2)."""
    if is_v2():
        return {controller: CGROUP_ROOT for controller in CONTROLLERS}
    mounts = v1_mounts()
    return {controller: mounts[controller] for controller in CONTROLLERS if controller in mounts}


def group_bases() -> list[Path]:
    """Each distinct directory the server's groups live under: one under v2, one per controller under v1."""
    return list(dict.fromkeys(controller_dirs().values()))


def server_groups(server_pid: int) -> list[Path]:
    """The `verl-sf-<pid>-*` groups a server made, in every place the layout has them."""
    return [group for base in group_bases() for group in base.glob(f"verl-sf-{server_pid}-*")]
