"""What the executor's session and snapshot tables share: live entries by id and by the id their
zygote knows them by, and why ended ones ended, kept (bounded) for a late request."""

from __future__ import annotations

import collections
from typing import Generic, Optional, Protocol, TypeVar


class Entry(Protocol):
    id: str
    open_id: int


EntryT = TypeVar("EntryT", bound=Entry)


class LiveTable(Generic[EntryT]):
    def __init__(self, boot_tag: str, ended_kept: int) -> None:
        self.boot_tag = boot_tag  # in every id: a restarted server tells an id from before it
        self.live: dict[str, EntryT] = {}
        self._by_open_id: dict[int, EntryT] = {}
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._ended_kept = ended_kept

    def __len__(self) -> int:
        return len(self.live)

    def add(self, entry: EntryT) -> None:
        self.live[entry.id] = entry
        self._by_open_id[entry.open_id] = entry

    def by_open_id(self, open_id: int) -> Optional[EntryT]:
        return self._by_open_id.get(open_id)

    def ended_reason(self, entry_id: str) -> Optional[str]:
        return self._ended.get(entry_id)

    def forget(self, entry: EntryT, reason: str) -> bool:
        """Out of the table, its reason kept for late callers; False if it was gone already."""
        if self.live.pop(entry.id, None) is None:
            return False
        self._by_open_id.pop(entry.open_id, None)
        self._ended[entry.id] = reason
        while len(self._ended) > self._ended_kept:
            self._ended.popitem(last=False)
        return True
