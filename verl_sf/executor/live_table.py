"""A table of live things that end: live entries by key, what is kept of ended ones (bounded,
oldest dropped) for a late request that asks why, and which entries are due to end.

`LiveTable` is the generic one: the executor's sessions and snapshots (through `ZygoteTable`,
which also finds an entry by the id its zygote knows it by), E2B's sandboxes and verl-tool's
trajectories each keep one.  Each owner says, from the entry, when it is due and why."""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from typing import Generic, Optional, Protocol, TypeVar

KeyT = TypeVar("KeyT", bound=Hashable)
EntryT = TypeVar("EntryT")
EndedT = TypeVar("EndedT")


class LiveTable(Generic[KeyT, EntryT, EndedT]):
    """`live`: the entries by key, in the order added (or `touch`ed); `ended(key)`: what `forget`
    kept of an ended one, the last `ended_kept` only (None: until `drop_ended`)."""

    def __init__(self, key: Callable[[EntryT], KeyT], ended_kept: Optional[int]) -> None:
        self.live: dict[KeyT, EntryT] = {}
        self._key = key
        self._ended: collections.OrderedDict[KeyT, EndedT] = collections.OrderedDict()
        self._ended_kept = ended_kept

    def __len__(self) -> int:
        return len(self.live)

    def add(self, entry: EntryT) -> None:
        self.live[self._key(entry)] = entry

    def touch(self, entry: EntryT) -> None:
        """The entry goes last, as if added now (a table kept least recently used first)."""
        key = self._key(entry)
        self.live[key] = self.live.pop(key)

    def remove(self, entry: EntryT) -> bool:
        """Out of the table, nothing kept of it; False if it was gone already."""
        return self.live.pop(self._key(entry), None) is not None

    def forget(self, entry: EntryT, ended: EndedT) -> bool:
        """Out of the table, `ended` kept for late callers; False (nothing kept) if it was gone already."""
        if not self.remove(entry):
            return False
        self._ended[self._key(entry)] = ended
        while self._ended_kept is not None and len(self._ended) > self._ended_kept:
            self._ended.popitem(last=False)
        return True

    def ended(self, key: KeyT) -> Optional[EndedT]:
        return self._ended.get(key)

    def drop_ended(self, key: KeyT) -> Optional[EndedT]:
        return self._ended.pop(key, None)

    def drop_ended_while(self, stale: Callable[[EndedT], bool]) -> None:
        """Drop what is kept of ended entries, oldest first, while `stale` says so."""
        while self._ended and stale(next(iter(self._ended.values()))):
            self._ended.popitem(last=False)

    def due(self, why: Callable[[EntryT], Optional[str]],
           stop: Optional[Callable[[EntryT], bool]] = None) -> list[tuple[EntryT, str]]:
        """The live entries due to end, with why (`why(entry)`; None: not due), in table order.
        `stop`: the scan ends at the first entry it holds for, where the table's order puts none
        due after it (one kept least recently used first, say)."""
        due = []
        for entry in self.live.values():
            if stop is not None and stop(entry):
                break
            reason = why(entry)
            if reason is not None:
                due.append((entry, reason))
        return due


class ZygoteEntry(Protocol):
    id: str
    open_id: int


ZygoteEntryT = TypeVar("ZygoteEntryT", bound=ZygoteEntry)


class ZygoteTable(LiveTable[str, ZygoteEntryT, str]):
    """The executor's sessions or snapshots: by id and by the id their zygote knows them by, and
    why ended ones ended; every id carries `boot_tag`, so a restarted server tells an id from before it."""

    def __init__(self, boot_tag: str, ended_kept: int) -> None:
        super().__init__(lambda entry: entry.id, ended_kept)
        self.boot_tag = boot_tag
        self._by_open_id: dict[int, ZygoteEntryT] = {}

    def add(self, entry: ZygoteEntryT) -> None:
        super().add(entry)
        self._by_open_id[entry.open_id] = entry

    def remove(self, entry: ZygoteEntryT) -> bool:
        if not super().remove(entry):
            return False
        self._by_open_id.pop(entry.open_id, None)
        return True

    def by_open_id(self, open_id: int) -> Optional[ZygoteEntryT]:
        return self._by_open_id.get(open_id)
