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
        self._values: dict[tuple[int, bytes], Entry] = {}
        # (kg, state+key) -> [last clear | None, user key -> [last remove, put run]]
        self._maps: dict[tuple[int, bytes], list[object]] = {}
        # (kg, state+key) -> (last clear or update | None, adds after it)
        self._lists: dict[tuple[int, bytes], tuple[Entry | None, list[Entry]]] = {}
        self._always: list[Entry] = []

    def feed(self, key_group: int, changes: Iterable[bytes], origin: int = 0) -> None:
        """Take the changes of ``key_group`` that come next in replay order;
        ``origin`` (an int the caller maps to, e.g., a segment) is handed back with
        each kept change. Never raises for a malformed change (it is kept)."""
        values, maps, lists, always = self._values, self._maps, self._lists, self._always
        pos = self._pos
        for change in changes:
            pos += 1
            try:
                op = change[1]
                end = _item_end(change, _item_end(change, 2))
                key = (key_group, change[2:end])
            except (ValueError, IndexError, msgpack.UnpackException):
                always.append((pos, key_group, change, origin))
                continue
            entry = (pos, key_group, change, origin)
            if op in _VALUE_OPS:
                values[key] = entry
            elif op == OP_LIST_ADD:
                lst = lists.get(key)
                if lst is None:
                    lists[key] = (None, [entry])
                else:
                    lst[1].append(entry)
            elif op in _LIST_RESETS:
                lists[key] = (entry, [])
            elif not self._map_change(maps, key, op, entry, end):
                always.append(entry)
        self.read += pos - self._pos
        self._pos = pos

    @staticmethod
    def _map_change(
        maps: dict[tuple[int, bytes], list[object]],
        key: tuple[int, bytes],
        op: int,
        entry: Entry,
        key_end: int,
    ) -> bool:
        """Record a map change; False if it is no map change or its user key does not
        parse (the caller keeps it unconditionally)."""
        if op == OP_MAP_CLEAR:
            maps[key] = [entry, {}]
            return True
        if op != OP_MAP_PUT and op != OP_MAP_REMOVE:
            return False
        change = entry[2]
        try:
            user_key = change[key_end : _item_end(change, key_end)]
        except (ValueError, IndexError, msgpack.UnpackException):
            return False
        m = maps.get(key)
        if m is None:
            m = maps[key] = [None, {}]
        per_user_key: dict[bytes, list[Entry | None]] = m[1]  # type: ignore[assignment]
        slots = per_user_key.get(user_key)
        if slots is None:
            slots = per_user_key[user_key] = [None, None]
        if op == OP_MAP_REMOVE:
            slots[0], slots[1] = entry, None
        elif slots[1] is None:
            slots[1] = entry
        else:  # the run of puts keeps its first position and takes the last value
            slots[1] = (slots[1][0], entry[1], change, entry[3])
        return True

    def kept(self) -> list[Entry]:
        """The changes to apply, in replay order: (position, key group, change, origin)."""
        out: list[Entry] = list(self._always)
        out.extend(self._values.values())
        for reset, adds in self._lists.values():
            if reset is not None:
                out.append(reset)
            out.extend(adds)
        for clear, per_user_key in self._maps.values():
            if clear is not None:
                out.append(clear)  # type: ignore[arg-type]
            for slots in per_user_key.values():  # type: ignore[attr-defined]
                out.extend(s for s in slots if s is not None)
        out.sort(key=_position)
        return out


def _position(entry: Entry) -> int:
    return entry[0]
