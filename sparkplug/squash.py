"""Squashing a changelog before it is replayed on restore (FLIP-151's idea).

Replay applies every change of a key group in SQN order (then append order), but most
of them are overwritten by a later one. :class:`ChangeSquasher` reads the changes of
one old task (the changes after its snapshot, across all its handles and segments, in
replay order), keeps only those that still matter, and gives them back in their
original order, so that applying them leaves the same state as applying all of them.

What is kept, per key group, state and key (the change's key bytes; the state
backend's change encoding, :mod:`dstltree.sparkplug.state_backend`):

- value state: only the last set or clear.
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
within each list do not.
"""

from __future__ import annotations

from collections.abc import Iterable
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


# (position, key group, change, origin): position orders kept changes as replay would
Entry = tuple[int, int, bytes, int]
_VALUE_OPS = frozenset((OP_VALUE_SET, OP_VALUE_CLEAR))
_LIST_RESETS = frozenset((OP_LIST_CLEAR, OP_LIST_SET))


class ChangeSquasher:
    """Collects changes in replay order (:meth:`feed`) and hands back the ones that
    matter (:meth:`kept`). ``read`` counts the changes fed. Memory: the kept changes
    (at most about two per value key, three per map user key, plus list adds)."""

    def __init__(self) -> None:
        self.read = 0
        self._pos = 0
        # per key group, by state+key bytes: value state -> its last set or clear
        self._values: dict[int, dict[bytes, Entry]] = {}
        # map state -> [last clear | None, {user key: [last remove, put run]}]
        self._maps: dict[int, dict[bytes, list[Any]]] = {}
        # list state -> (last clear or update | None, adds after it)
        self._lists: dict[int, dict[bytes, tuple[Entry | None, list[Entry]]]] = {}
        self._always: list[Entry] = []

    def feed(self, key_group: int, changes: Iterable[bytes], origin: int = 0) -> None:
        """Take the changes of ``key_group`` that come next in replay order;
        ``origin`` (an int the caller maps to, e.g., a segment) is handed back with
        each kept change. Never raises for a malformed change (it is kept)."""
        values = self._values.setdefault(key_group, {})
        lists = self._lists.setdefault(key_group, {})
        maps = self._maps.setdefault(key_group, {})
        always, size, pos = self._always, _SIZE, self._pos
        value_ops, list_resets = _VALUE_OPS, _LIST_RESETS
        for change in changes:
            pos += 1
            entry = (pos, key_group, change, origin)
            try:  # the state name and the key, fast paths inline
                n = size[change[2]]
                p = 2 + n if n else _item_end(change, 2)
                n = size[change[p]]
                end = p + n if n else _item_end(change, p)
                op = change[1]
            except (ValueError, IndexError, msgpack.UnpackException):
                always.append(entry)
                continue
            if end > len(change):
                always.append(entry)
            elif op in value_ops:
                values[change[2:end]] = entry
            elif op == OP_LIST_ADD:
                lst = lists.get(change[2:end])
                if lst is None:
                    lists[change[2:end]] = (None, [entry])
                else:
                    lst[1].append(entry)
            elif op in list_resets:
                lists[change[2:end]] = (entry, [])
            elif not _map_change(maps, change[2:end], op, entry, end):
                always.append(entry)
        self.read += pos - self._pos
        self._pos = pos

    def kept(self) -> list[Entry]:
        """The changes to apply, in replay order: (position, key group, change, origin)."""
        out: list[Entry] = list(self._always)
        for values in self._values.values():
            out.extend(values.values())
        for lists in self._lists.values():
            for reset, adds in lists.values():
                if reset is not None:
                    out.append(reset)
                out.extend(adds)
        for maps in self._maps.values():
            for clear, per_user_key in maps.values():
                if clear is not None:
                    out.append(clear)
                for slots in per_user_key.values():
                    out.extend(s for s in slots if s is not None)
        out.sort(key=_position)
        return out


def _map_change(maps: dict[bytes, list[Any]], key: bytes, op: int, entry: Entry, end: int) -> bool:
    """Record in ``maps`` (one key group's) a change of the map of state+key ``key``
    whose user key starts at offset ``end``; False if it is no map change or its user
    key does not parse (the caller then keeps it unconditionally)."""
    if op == OP_MAP_CLEAR:
        maps[key] = [entry, {}]
        return True
    if op != OP_MAP_PUT and op != OP_MAP_REMOVE:
        return False
    change = entry[2]
    try:
        n = _SIZE[change[end]]
        uk_end = end + n if n else _item_end(change, end)
    except (ValueError, IndexError, msgpack.UnpackException):
        return False
    if uk_end > len(change):
        return False
    user_key = change[end:uk_end]
    m = maps.get(key)
    if m is None:
        m = maps[key] = [None, {}]
    slots = m[1].get(user_key)
    if slots is None:
        slots = m[1][user_key] = [None, None]
    if op == OP_MAP_REMOVE:
        slots[0], slots[1] = entry, None
    elif slots[1] is None:
        slots[1] = entry
    else:  # the run of puts keeps its first position and takes the last value
        slots[1] = (slots[1][0], entry[1], change, entry[3])
    return True


def _position(entry: Entry) -> int:
    return entry[0]
