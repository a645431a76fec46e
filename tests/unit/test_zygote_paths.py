"""Path safety in the zygote: a request's file paths are split beneath the run's roots, or refused."""

from __future__ import annotations

import pytest

from verl_sf.executor import zygote


def test_paths_are_split_beneath_their_roots() -> None:
    roots = ["/workdir", "/tmp", "/mnt/data"]
    assert zygote._split_path("a/b.txt", roots) == ("/workdir", ["a", "b.txt"])
    assert zygote._split_path("/mnt/data/p.png", roots) == ("/mnt/data", ["p.png"])
    for bad in ("/etc/passwd", "a/../../etc", "", "/tmp", "x\x00y"):
        with pytest.raises(ValueError):
            zygote._split_path(bad, roots)
