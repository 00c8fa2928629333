"""Squashing a changelog before it is replayed on restore (FLIP-151's idea).

Restore itself squashes with :class:`dstltree.sparkplug.replay.BulkReplay` (the same
rules, in flat dictionaries, decoding only what is kept); :class:`ChangeSquasher`
stays as the reference implementation of the rules and for callers that want the
kept changes in their original order.

Replay applies every change of a key group in SQN order (then append order), but most
of them are overwritten by a later one. :class:`ChangeSquasher` reads the changes of
one old task (the changes after its snapshot, across all its handles and segments, in
replay order), keeps only those that still matter, and gives them back in their
original order, so that applying them leaves the same state as applying all of them.

What is kept, per key group, state and key (the change's key bytes; the state
backend's change encoding, :mod:`dstltree.sparkplug.state_backend`):

- value state: only the last set or clear. A value sets change (``OP_VALUE_SETS``,
  many keys' last sets and clears in one) is always kept, in order: a set or clear of
  one of its keys that it supersedes is applied before it, one that supersedes it
  after it.
- map state: the last clear of the key's map; after it, per user key, the last remove
  and, if the last change of that user key is a put, one put carrying the last value
  at the position of the first put after that remove (or clear), so that a later
  ``MapState.items()`` lists user keys in the same insertion order.
- list state: the last clear or update (``ListState.update``, which replaces the
  list) and every add after it, in order; all adds when there is neither.

Decided limits: the state, key and user key of every change are parsed, but the value
of a superseded change is never decoded, so a corrupt value inside a superseded
change goes unnoticed (it never reaches the state). A change whose state or key cannot
be parsed, or of an unknown operation, is always kept, in order, so that replaying it
raises exactly as without squashing. Changes of one state name under two kinds each
keep at least one change per kind, so the kind clash is still raised. The order in
which *different* keys are stored (the iteration order of
``KeyedStateBackend.items`` and thus the bytes of a later snapshot) may differ from a
full replay; the contents, the order of user keys within each map and of values
within each list do not. Memory: the squasher holds every change fed until
:meth:`ChangeSquasher.kept` is consumed (the changes of one old task since its
snapshot), plus one byte per change and a few ints per state key; a kept put that
carries a later put's value reports the first put's origin.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgpack

from dstltree.sparkplug.state_backend import (
    OP_LIST_ADD,
    OP_LIST_CLEAR,
    OP_LIST_SET,
    OP_MAP_CLEAR,
    OP_MAP_PUT,
    OP_MAP_REMOVE,
    OP_VALUE_CLEAR,
    OP_VALUE_SET,
    OP_VALUE_SETS,
)


def _fixed_sizes() -> list[int]:
    """Per first byte of a msgpack item, its whole size in bytes; 0 when the size
    depends on the following bytes (long strings, binaries, arrays, maps, ext)."""
    size = [0] * 256
    for b in list(range(0x00, 0x80)) + list(range(0xE0, 0x100)) + [0xC0, 0xC2, 0xC3]:
        size[b] = 1  # fixints, nil, false, true
    for b in range(0xA0, 0xC0):
        size[b] = 1 + (b & 0x1F)  # fixstr
    for b, n in ((0xCC, 2), (0xD0, 2), (0xCD, 3), (0xD1, 3), (0xCE, 5), (0xD2, 5)):
        size[b] = n
    for b, n in ((0xCA, 5), (0xCF, 9), (0xD3, 9), (0xCB, 9)):
        size[b] = n
    for b, n in ((0xD4, 3), (0xD5, 4), (0xD6, 6), (0xD7, 10), (0xD8, 18)):
        size[b] = n  # fixext
    return size


_SIZE = _fixed_sizes()


def _item_end(buf: bytes, pos: int) -> int:
    """The offset just past the msgpack item starting at ``pos`` of ``buf``. Raises
    ValueError (msgpack's errors included) for a truncated or malformed item."""
    n = _SIZE[buf[pos]]
    if n:
        end = pos + n
    elif buf[pos] in (0xD9, 0xC4):  # str8, bin8
        end = pos + 2 + buf[pos + 1]
    else:
        unpacker = msgpack.Unpacker()
        unpacker.feed(buf[pos:])
        unpacker.skip()
        end = pos + unpacker.tell()
    if end > len(buf):
        raise ValueError(f"msgpack item at {pos} ends at {end}, past {len(buf)} bytes")
    return end


# (position, key group, change, origin): what :meth:`ChangeSquasher.kept` yields
Entry = tuple[int, int, bytes, int]
_VALUE_OPS = frozenset((OP_VALUE_SET, OP_VALUE_CLEAR))
_LIST_RESETS = frozenset((OP_LIST_CLEAR, OP_LIST_SET))


class ChangeSquasher:
    """Collects changes in replay order (:meth:`feed`) and hands back the ones that
    matter (:meth:`kept`). ``read`` counts the changes fed. Memory: references to
    every change fed (the lists given to :meth:`feed` are kept, not copied) plus one
    byte and, per state key, a few ints of bookkeeping per change."""

    def __init__(self) -> None:
        self.read = 0
        self._alive = bytearray()  # per position: 1 to apply, 0 superseded
        self._batches: list[tuple[int, int, Sequence[bytes], int]] = []
        self._moved: dict[int, bytes] = {}  # first put of a run -> the run's last put
        # per key group, by state+key bytes: value state -> position of its last change
        self._values: dict[int, dict[bytes, int]] = {}
        # map state -> [last clear | -1, {user key: [last remove | -1, put run | -1]}]
        self._maps: dict[int, dict[bytes, list[Any]]] = {}
        # list state -> positions of its last clear or update and the adds after it
        self._lists: dict[int, dict[bytes, list[int]]] = {}

    def feed(self, key_group: int, changes: Sequence[bytes], origin: int = 0) -> None:
        """Take the changes of ``key_group`` that come next in replay order;
        ``origin`` (an int the caller maps to, e.g., a segment) is handed back with
        each kept change. Never raises for a malformed change (it is kept)."""
        values = self._values.setdefault(key_group, {})
        lists = self._lists.setdefault(key_group, {})
        maps = self._maps.setdefault(key_group, {})
        alive, size, pos = self._alive, _SIZE, len(self._alive)
        value_ops, list_resets = _VALUE_OPS, _LIST_RESETS
        self._batches.append((pos, key_group, changes, origin))
        alive.extend(b"\x01" * len(changes))
        for change in changes:
            try:  # the state name and the key, fast paths inline
                n = size[change[2]]
                p = 2 + n if n else _item_end(change, 2)
                n = size[change[p]]
                end = p + n if n else _item_end(change, p)
                op = change[1]
            except (ValueError, IndexError, msgpack.UnpackException):
                end = len(change) + 1
            if end > len(change) or op == OP_VALUE_SETS:
                pass  # kept as it is (value sets: in order, their entries not looked into)
            elif op in value_ops:
                old = values.get(change[2:end])
                if old is not None:
                    alive[old] = 0
                values[change[2:end]] = pos
            elif op == OP_LIST_ADD:
                lst = lists.get(change[2:end])
                if lst is None:
                    lists[change[2:end]] = [pos]
                else:
                    lst.append(pos)
            elif op in list_resets:
                for old in lists.get(change[2:end], ()):
                    alive[old] = 0
                lists[change[2:end]] = [pos]
            else:
                self._map_change(maps, change[2:end], op, pos, end, change)
            pos += 1
        self.read += len(changes)

    def _map_change(
        self, maps: dict[bytes, list[Any]], key: bytes, op: int, pos: int, end: int, change: bytes
    ) -> None:
        """Record a change of the map of state+key ``key`` (one key group's ``maps``)
        at ``pos`` whose user key starts at offset ``end``; a change that is no map
        change or whose user key does not parse stays as it is."""
        if op == OP_MAP_CLEAR:
            old = maps.get(key)
            if old is not None:
                self._kill(old[0], *(p for slots in old[1].values() for p in slots))
            maps[key] = [pos, {}]
            return
        if op != OP_MAP_PUT and op != OP_MAP_REMOVE:
            return
        try:
            n = _SIZE[change[end]]
            uk_end = end + n if n else _item_end(change, end)
        except (ValueError, IndexError, msgpack.UnpackException):
            return
        if uk_end > len(change):
            return
        m = maps.get(key)
        if m is None:
            m = maps[key] = [-1, {}]
        slots = m[1].get(change[end:uk_end])
        if slots is None:
            slots = m[1][change[end:uk_end]] = [-1, -1]
        if op == OP_MAP_REMOVE:
            self._kill(*slots)
            slots[0], slots[1] = pos, -1
        elif slots[1] < 0:
            slots[1] = pos
        else:  # the run of puts keeps its first position and takes the last value
            self._alive[pos] = 0
            self._moved[slots[1]] = change

    def _kill(self, *positions: int) -> None:
        """Mark ``positions`` superseded (negative ones are none)."""
        for p in positions:
            if p >= 0:
                self._alive[p] = 0
                self._moved.pop(p, None)

    def kept(self) -> Iterator[Entry]:
        """The changes to apply, in replay order: (position, key group, change, origin)."""
        alive, moved = self._alive, self._moved
        for start, kg, changes, origin in self._batches:
            pos = start
            for change in changes:
                if alive[pos]:
                    yield pos, kg, (moved.get(pos, change) if moved else change), origin
                pos += 1
