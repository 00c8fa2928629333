"""Flush groups held at the node that writes them: pure, no I/O, no clock.

A flush group (client/batching.py :class:`FlushGroup`) is a set of items that belong in
one object, sent by several contributors (the bridges of the hosts that held one
Structured Streaming batch's files) through different nodes. The persist delay or the
all-persisted rule of an ordinary batch would cut it wherever its parts happen to
arrive apart; so the node whose route for the items is itself keeps them here until
every contributor's items are in (``parts`` contributors, each with its ``count``), or
until ``wait`` seconds after the first one arrived, then writes them as one object. A
group whose parts go to different writers (plans naming several collectors) is written
by each after its wait: correctness never depends on a group completing, only the
number of objects does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dstltree.client.batching import PersistItem

MAX_GROUPS = 1024  # groups held at once: a new one beyond lets the oldest go at once


@dataclass
class _Held:
    first_at: float
    parts: int
    expected: dict[str, int] = field(default_factory=dict)  # contributor -> count
    got: dict[str, int] = field(default_factory=dict)  # contributor -> items held
    items: list[PersistItem] = field(default_factory=list)
    nbytes: int = 0

    def complete(self) -> bool:
        return len(self.expected) >= self.parts and all(
            self.got.get(c, 0) >= n for c, n in self.expected.items()
        )


class GroupHold:
    """Items of flush groups waiting for their last parts; ``wait``: seconds a group is
    held at most after its first item."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self._groups: dict[str, _Held] = {}  # by gid, oldest first
        self.nbytes = 0

    def add(self, item: PersistItem, now: float) -> list[PersistItem]:
        """Hold ``item`` (which has a group); the items to write now: its whole group
        once complete, an older group pushed out by the bound, else none."""
        g = item.group
        assert g is not None
        out: list[PersistItem] = []
        held = self._groups.get(g.gid)
        if held is None:
            if len(self._groups) >= MAX_GROUPS:
                out += self._release(next(iter(self._groups)))
            held = self._groups[g.gid] = _Held(now, g.parts)
        held.parts = max(held.parts, g.parts)
        held.expected[g.contributor] = max(held.expected.get(g.contributor, 0), g.count)
        held.got[g.contributor] = held.got.get(g.contributor, 0) + 1
        held.items.append(item)
        held.nbytes += item.size
        self.nbytes += item.size
        if held.complete():
            out += self._release(g.gid)
        return out

    def due(self, now: float) -> list[PersistItem]:
        """The items of groups held ``wait`` seconds or more (their parts went elsewhere
        or were lost): to write now."""
        out: list[PersistItem] = []
        while self._groups:
            gid, held = next(iter(self._groups.items()))
            if now - held.first_at < self.wait:
                break
            out += self._release(gid)
        return out

    def take_all(self) -> list[PersistItem]:
        """Every held item (the node shuts down)."""
        out: list[PersistItem] = []
        for gid in list(self._groups):
            out += self._release(gid)
        return out

    def deadline(self) -> float | None:
        """When the oldest group's wait ends (None: nothing held)."""
        if not self._groups:
            return None
        return next(iter(self._groups.values())).first_at + self.wait

    def items(self) -> list[PersistItem]:
        return [i for h in self._groups.values() for i in h.items]

    def __len__(self) -> int:
        return len(self._groups)

    def _release(self, gid: str) -> list[PersistItem]:
        held = self._groups.pop(gid)
        self.nbytes -= held.nbytes
        return held.items
