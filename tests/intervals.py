"""Concurrency measured from timestamps the sandboxed code took itself (never from a counter in
the component under test)."""

from __future__ import annotations


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Deepest nesting of [start, end) intervals; an end at t comes before a start at t."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    depth = deepest = 0
    for _, step in events:
        depth += step
        deepest = max(deepest, depth)
    return deepest
