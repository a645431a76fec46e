"""What a cell keeps when its displays are left out: a prefix, its result, and an E2B note last
whose index of the result matches what was kept."""

from __future__ import annotations

from verl_sf.executor.zygote.messages import NOTE, kept_displays


def _shown(count: int, note_main: object = None) -> list[dict[str, object]]:
    shown: list[dict[str, object]] = [{"text/plain": str(i)} for i in range(count)]
    return shown + [{NOTE: {"count": 4, "main": note_main}}] if note_main is not None else shown


def test_the_result_past_the_prefix_is_kept_and_the_note_points_at_it() -> None:
    assert kept_displays(_shown(10, 7), 2, 7) == [{"text/plain": "0"}, {"text/plain": "1"}, {"text/plain": "7"},
                                                  {NOTE: {"count": 4, "main": 2}}]


def test_a_result_within_the_prefix_keeps_its_index() -> None:
    assert kept_displays(_shown(10, 1), 3, 1)[-1] == {NOTE: {"count": 4, "main": 1}}
    assert len(kept_displays(_shown(10, 1), 3, 1)) == 4


def test_without_a_result_or_a_note() -> None:
    assert kept_displays(_shown(5), 0, None) == []
    assert kept_displays(_shown(5), 0, 4) == [{"text/plain": "4"}]
    assert kept_displays(_shown(5, 9), 0, 9) == [{NOTE: {"count": 4, "main": None}}]  # an index past them
    forged = [{NOTE: "forged"}, {"text/plain": "x"}, {NOTE: "not a dict"}]
    assert kept_displays(forged, 0, None) == [{NOTE: {"main": None}}]
