"""Pages of a sandbox list by cursor (verl_sf/pages.py): stable while the list changes."""

from __future__ import annotations

import pytest

from verl_sf.pages import BadCursor, page


def key(item: dict[str, str]) -> tuple[str, str]:
    return item["at"], item["id"]


def walk(items: list[dict[str, str]], limit: int, between: object = None) -> list[str]:
    seen, cursor = [], None
    while True:
        shown, cursor = page(items, key, cursor, limit)
        seen += [item["id"] for item in shown]
        if callable(between):
            between(items, shown)
        if cursor is None:
            return seen


ITEMS = [{"at": f"2026-11-27T00:00:0{i // 2}.000000Z", "id": f"s{i}"} for i in range(9)]


def test_pages_give_every_item_once_in_order() -> None:
    assert walk(list(ITEMS), 2) == [f"s{i}" for i in range(9)]
    assert page(list(ITEMS), key, None, None) == (ITEMS, None)


def test_an_item_that_ends_between_pages_moves_no_other_off_its_page() -> None:
    def end_the_first_shown(items: list[dict[str, str]], shown: list[dict[str, str]]) -> None:
        if shown:
            items.remove(shown[0])

    assert walk(list(ITEMS), 3, end_the_first_shown) == [f"s{i}" for i in range(9)]


@pytest.mark.parametrize("cursor", ["x", "9" * 5000, "-1", "W10", "WyJhIl0", "\u00e9", "eyJhIjogMX0"])
def test_a_cursor_no_page_gave_is_refused(cursor: str) -> None:
    with pytest.raises(BadCursor):
        page(list(ITEMS), key, cursor, 2)
