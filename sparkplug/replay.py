"""Bulk replay of a changelog on restore: squash first, decode only what is applied.

:class:`BulkReplay` takes the changes of one old task in replay order
(:meth:`BulkReplay.feed`, per key group, as sliced from the segments: bytes or
read-only memoryviews), reads of each change only its operation, state name, key and
(map state) user key, and keeps in dictionaries only the changes that still matter
(the squash of :mod:`dstltree.sparkplug.squash`, FLIP-151):

- value state: the last set or clear per state and key (a value sets change counts as
  the sets and clears of its entries, in the map's order);
- map state: the last clear per state and key; after it, per user key, the last
  remove, and the last put since that remove (or clear) placed where the first of those
  puts came, so the map's insertion order is that of a full replay;
- list state: the last clear or update and every add after it, in order.

:meth:`BulkReplay.apply` then decodes each kept state name and key once, checks that it
is in its canonical encoding and hashes to its key group, and only then writes the
kept values into the backend's buckets (:meth:`KeyedStateBackend.replay_bucket`),
each value decoded and re-encoded once (so a malformed kept value raises as in a full
replay).

Exactness: anything a change-by-change replay would treat differently is handed to it
instead: when a change's operation is unknown or its state name or key does not parse,
or a kept change does not have the array length the backend writes for its operation,
or a kept state name, key or user key is not canonically encoded (two encodings of one
key), or hashes to another key group, or a state is used with two kinds, or map clears
would scan more than ``_SCAN_BUDGET`` squash entries, the whole task is replayed
change by change with :meth:`KeyedStateBackend.apply_change`, which raises exactly the
errors of a full replay. As with squashing, a corrupt value (or array length) inside a
superseded change goes unnoticed, and the order in which different keys are stored
may differ from a full replay (contents, map and list orders do not).

Memory: references to every change fed (one list per feed) plus one dictionary entry
per state key, map user key and kept list change, until :meth:`BulkReplay.apply`; for a
key last written by a value sets change, the value change it stands for (built once
per entry, its state name copied: a change whose name would be copied more than four
times its own size goes change by change instead).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from dstltree.sparkplug.squash import _SIZE, _item_end
from dstltree.sparkplug.state_backend import (
    LIST,
    MAP,
    OP_LIST_ADD,
    OP_LIST_CLEAR,
    OP_LIST_SET,
    OP_MAP_CLEAR,
    OP_MAP_PUT,
    OP_MAP_REMOVE,
    OP_VALUE_CLEAR,
    OP_VALUE_SET,
    OP_VALUE_SETS,
    VALUE,
    KeyedStateBackend,
)

# per operation: the array header byte of the change the backend writes for it
_HEAD = {
    OP_VALUE_SET: 0x94,
    OP_VALUE_CLEAR: 0x93,
    OP_MAP_PUT: 0x95,
    OP_MAP_REMOVE: 0x94,
    OP_MAP_CLEAR: 0x93,
    OP_LIST_ADD: 0x94,
    OP_LIST_CLEAR: 0x93,
    OP_LIST_SET: 0x94,
}
_HEAD_OF = [_HEAD.get(op, 0) for op in range(256)]
_SET_HEAD, _CLEAR_HEAD = bytes([0x94, OP_VALUE_SET]), bytes([0x93, OP_VALUE_CLEAR])
# per first byte of a state name: the offset in a change just past a fixstr name, else 0
# (lists, not bytes: indexing a list by an int is the specialized fast path)
_NAME_END = [3 + (b & 0x1F) if 0xA0 <= b <= 0xBF else 0 for b in range(256)]
_PARSE_ERRORS = (ValueError, IndexError, TypeError, msgpack.UnpackException)
_DECODE_ERRORS = (*_PARSE_ERRORS, KeyError)
unpackb = msgpack.unpackb
_SCAN_BUDGET = 1 << 22  # dictionary entries map clears may scan in one replay
_NAME_COPIES = 4  # a value sets change's name copies allowed, in times its bytes
# the steps of a write plan, in order, and the kind of state each writes
_VALUE, _MCLEAR, _MREMOVE, _MPUT, _LIST = range(5)
_KINDS = (VALUE, MAP, MAP, MAP, LIST)


class _Irregular(Exception):
    """The changes need a change-by-change replay (module docstring)."""


def _key_end(change: Any) -> int:
    """The offset just past the key of ``change`` whose state name is any string;
    raises _Irregular for another name, a parse error for a malformed item."""
    first = change[2]
    if not (0xA0 <= first <= 0xBF or 0xD9 <= first <= 0xDB):
        raise _Irregular
    n = _SIZE[first]
    p = 2 + n if n else _item_end(change, 2)
    n = _SIZE[change[p]]
    return p + n if n else _item_end(change, p)


class BulkReplay:
    """Squash-then-apply replay of one old task's changes into ``backend`` (module
    docstring). ``read`` counts the changes fed, a value sets change as the changes
    it stands for (final once :meth:`apply` returned). Not thread-safe."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.read = 0
        self._b = backend
        self._pack = msgpack.Packer().pack
        self._batches: list[tuple[int, Sequence[Any], int]] = []
        self._irregular = False
        # entries of the map clears' scans left before a change-by-change replay
        self._scan_budget = _SCAN_BUDGET
        # per key group: state+key bytes -> the last value change
        self._values: dict[int, dict[Any, Any]] = {}
        # ... state+key bytes -> the map's last clear
        self._mclears: dict[int, dict[Any, Any]] = {}
        # ... state+key+user key bytes -> its last remove / its last put (placed first)
        self._mremoves: dict[int, dict[Any, Any]] = {}
        self._mputs: dict[int, dict[Any, Any]] = {}
        # ... state+key bytes -> the list's last clear or update and the adds after it
        self._lists: dict[int, dict[Any, list[Any]]] = {}
        self._kinds: dict[str, str] = {}  # while planning: state name -> kind
        self._names: dict[Any, str] = {}  # while planning: name bytes -> name
        self._user_keys: dict[Any, bytes] = {}  # user key bytes checked canonical

    def feed(self, key_group: int, changes: Sequence[Any], origin: int = 0) -> None:
        """Take the changes (bytes-like, each a whole change) of ``key_group`` that come
        next in replay order; ``origin`` (an int the caller maps to, e.g., a segment)
        names where a change came from in :meth:`apply`'s errors. Never raises; the
        list is kept, not copied."""
        self._batches.append((key_group, changes, origin))
        self.read += len(changes)
        if self._irregular or key_group not in self._b.key_groups:
            return
        try:
            self._squash(key_group, changes)
        except (_Irregular, *_PARSE_ERRORS):
            self._irregular = True

    def _squash(self, key_group: int, changes: Sequence[Any]) -> None:
        """Record ``changes`` in the squash dictionaries; raises _Irregular (or a parse
        error) for a change that needs a change-by-change replay. Only the state name
        and key (and a map change's user key) are parsed here; the array header of a
        kept change is checked by :meth:`_plan`. A value sets change is recorded as
        the value sets and clears of its entries (:meth:`_expand_sets`)."""
        values = self._values.setdefault(key_group, {})
        puts = self._mputs.setdefault(key_group, {})
        lists = self._lists.setdefault(key_group, {})
        name_end, size = _NAME_END, _SIZE
        for c in changes:
            p = name_end[c[2]]
            end = p + size[c[p]]  # p 0 (no fixstr name): c[0], an array header, sizes 0
            if end <= p:
                if c[1] == OP_VALUE_SETS:  # its third item, a map, has no fixed size
                    self._expand_sets(c, values)
                    continue
                end = _key_end(c)
            op = c[1]
            if op < OP_MAP_PUT:  # a value set or clear
                values[c[2:end]] = c
            elif op == OP_MAP_PUT:
                ue = end + size[c[end]]
                puts[c[2 : ue if ue > end else _item_end(c, end)]] = c
            elif op == OP_LIST_ADD:
                lst = lists.get(c[2:end])
                if lst is None:
                    lists[c[2:end]] = [c]
                else:
                    lst.append(c)
            elif op == OP_MAP_REMOVE:
                ue = end + size[c[end]]
                skuk = c[2 : ue if ue > end else _item_end(c, end)]
                puts.pop(skuk, None)
                self._mremoves.setdefault(key_group, {})[skuk] = c
            elif op == OP_MAP_CLEAR:
                self._map_clear(key_group, c[2:end], c)
            elif op <= OP_LIST_SET:  # a list clear or update
                lists[c[2:end]] = [c]
            else:
                raise _Irregular

    def _expand_sets(self, change: Any, values: dict[Any, Any]) -> None:
        """Record the entries of ``[OP_VALUE_SETS, name, {key: value | nil}]`` in
        ``values`` as the value set (or clear) each stands for, built as the backend
        writes one (so :meth:`_plan` and :meth:`_write` treat them as any other);
        raises _Irregular, or a parse error, for a change the backend does not write,
        an empty one (its replay still declares the state), or one whose name, copied
        into each entry's change, would take more than ``_NAME_COPIES`` times the
        change's bytes (a long name before many tiny entries: the change-by-change
        replay copies nothing per entry)."""
        name, entries = _sets_entries(change)
        if len(entries) * len(name) > _NAME_COPIES * len(change):
            raise _Irregular
        set_head, clear_head = _SET_HEAD + name, _CLEAR_HEAD + name
        for kb, vb in entries.items():
            if type(kb) is not bytes:
                raise _Irregular
            if vb is None:
                values[name + kb] = clear_head + kb
            elif type(vb) is bytes:
                values[name + kb] = set_head + kb + vb
            else:
                raise _Irregular
        self.read += len(entries) - 1  # the change counted once by feed stands for these

    def _map_clear(self, key_group: int, sk: Any, change: Any) -> None:
        """Record a clear of the map of state+key bytes ``sk``: drop its user keys'
        removes and puts so far (a scan of the key group's; raises _Irregular when the
        scans have used up their budget)."""
        self._mclears.setdefault(key_group, {})[sk] = change
        for per_kg in (self._mputs, self._mremoves):
            kept = per_kg.get(key_group)
            if not kept:
                continue
            self._scan_budget -= len(kept)
            if self._scan_budget < 0:
                raise _Irregular
            for skuk in [k for k in kept if k[: len(sk)] == sk]:
                del kept[skuk]

    def apply(self, where: Sequence[str]) -> int:
        """Apply the kept changes (all of them, change by change, when the changes are
        irregular); returns how many were applied. Raises ValueError ("segment at
        W: bad state change ...", W = ``where[origin]`` of the failing change) as a
        full replay does."""
        plan: list[tuple[int, int, Any, Any]] | None = None
        if not self._irregular:
            try:
                plan = self._plan()
            except (_Irregular, *_PARSE_ERRORS):
                plan = None
        if plan is None:
            return self._one_by_one(where)
        return sum(self._write(*step, where) for step in plan)

    def _plan(self) -> list[tuple[int, int, Any, Any]]:
        """(step, key group, resolved keys, kept) per step and key group, in the order
        to write them (values, map clears, map removes, map puts, lists), after
        checking every kept change's array header and every state name, key and user
        key: canonical, hashing to its key group, one kind per state. Resolved keys
        map state+key bytes to (name, key bytes, length, (name, key group)); user keys
        are resolved in ``_user_keys``. Nothing is allocated per kept change (no
        garbage-collector passes over the state). Raises _Irregular; changes
        nothing."""
        b = self._b
        self._kinds = {name: b.state_kind(name) for name in b.state_names()}
        self._names = {}
        plan: list[tuple[int, int, Any, Any]] = []
        steps = (
            (_VALUE, VALUE, self._values),
            (_MCLEAR, MAP, self._mclears),
            (_MREMOVE, MAP, self._mremoves),
            (_MPUT, MAP, self._mputs),
            (_LIST, LIST, self._lists),
        )
        head_of = _HEAD_OF
        for step, kind, per_kg in steps:
            for kg, kept in per_kg.items():
                keys: dict[Any, tuple[str, bytes, int, tuple[str, int]]] = {}
                plan.append((step, kg, keys, kept))
                if step in (_MPUT, _MREMOVE):
                    self._plan_user_keys(kg, kind, kept, keys)
                    continue
                for sk, item in kept.items():
                    if step == _LIST:
                        for c in item:
                            if c[0] != head_of[c[1]]:
                                raise _Irregular
                    elif item[0] != head_of[item[1]]:
                        raise _Irregular
                    if sk not in keys:
                        self._resolve(keys, sk, kg, kind)
        return plan

    def _plan_user_keys(
        self,
        kg: int,
        kind: str,
        kept: dict[Any, Any],
        keys: dict[Any, tuple[str, bytes, int, tuple[str, int]]],
    ) -> None:
        """Check one key group's kept map removes or puts (by state+key+user key
        bytes) and resolve their keys into ``keys`` and user keys into ``_user_keys``.
        Raises _Irregular."""
        head_of, user_keys = _HEAD_OF, self._user_keys
        for skuk, c in kept.items():
            if c[0] != head_of[c[1]]:
                raise _Irregular
            end = _user_key_at(skuk)
            if skuk[end:] not in user_keys:
                user_keys[skuk[end:]] = self._canonical(skuk[end:])
            if skuk[:end] not in keys:
                self._resolve(keys, skuk[:end], kg, kind)

    def _canonical(self, item: Any) -> bytes:
        """The msgpack item ``item`` as bytes; raises _Irregular unless canonical."""
        data = self._pack(unpackb(item, strict_map_key=False))
        if data != item:
            raise _Irregular
        return data

    def _resolve(
        self, keys: dict[Any, tuple[str, bytes, int, tuple[str, int]]], sk: Any, kg: int, kind: str
    ) -> tuple[str, bytes, int, tuple[str, int]]:
        """(state name, key bytes, length of state+key bytes, (state name, ``kg``)) of
        the state+key bytes ``sk``, also stored in ``keys``; raises _Irregular unless
        both are canonical, the key hashes to ``kg`` and the state has one kind (the
        backend's kinds and those planned so far)."""
        n = _SIZE[sk[0]]
        p = n if n else _item_end(sk, 0)
        name = self._names.get(sk[:p])
        if name is None:
            name = unpackb(sk[:p])
            if type(name) is not str or self._pack(name) != sk[:p]:
                raise _Irregular
            self._names[sk[:p]] = name
        if self._kinds.setdefault(name, kind) != kind:
            raise _Irregular
        kb = self._canonical(sk[p:])
        if zlib.crc32(kb) % self._b.max_parallelism != kg:
            raise _Irregular
        resolved = keys[sk] = (name, kb, len(sk), (name, kg))
        return resolved

    def _write(
        self, step: int, kg: int, keys: dict[Any, Any], kept: dict[Any, Any], where: Sequence[str]
    ) -> int:
        """Write one planned step of key group ``kg`` into the backend; returns the
        changes applied."""
        b, pack, user_keys = self._b, self._pack, self._user_keys
        buckets: dict[tuple[str, int], dict[bytes, Any]] = {}
        applied = 0
        kind, by_user_key = _KINDS[step], step in (_MPUT, _MREMOVE)
        for sk_or_skuk, item in kept.items():
            if by_user_key:
                end = _user_key_at(sk_or_skuk)
                ukb = user_keys[sk_or_skuk[end:]]
                name, kb, skl, bucket_key = keys[sk_or_skuk[:end]]
            else:
                name, kb, skl, bucket_key = keys[sk_or_skuk]
            bucket = buckets.get(bucket_key)
            if bucket is None:
                bucket = buckets[bucket_key] = b.replay_bucket(name, kind, kg)
            try:
                applied += 1
                if step == _MPUT:
                    m = bucket.get(kb)
                    if m is None:
                        m = bucket[kb] = {}
                    m[ukb] = pack(unpackb(item[2 + skl + len(ukb) :], strict_map_key=False))
                elif step == _VALUE:
                    if item[1] == OP_VALUE_SET:
                        bucket[kb] = pack(unpackb(item[2 + skl :], strict_map_key=False))
                    else:
                        bucket.pop(kb, None)
                elif step == _MREMOVE:
                    m = bucket.get(kb)
                    if m is not None:
                        m.pop(ukb, None)
                        if not m:
                            del bucket[kb]
                elif step == _MCLEAR:
                    bucket.pop(kb, None)
                else:
                    applied += _write_list(pack, bucket, kb, skl, item) - 1
            except _DECODE_ERRORS:
                self._raise_for(step, kg, item, where)
        return applied

    def _raise_for(self, step: int, kg: int, item: Any, where: Sequence[str]) -> None:
        """Raise the error of a full replay for the kept change(s) ``item`` of which one
        failed to decode: each is applied change by change until one raises."""
        changes = item if step == _LIST else [item]
        for c in changes:
            try:
                self._b.apply_change(kg, c)
            except ValueError as e:
                raise ValueError(f"segment at {where[self._origin(c)]}: {e}") from e
        raise AssertionError("a kept change failed to decode but replays")  # pragma: no cover

    def _origin(self, change: Any) -> int:
        """The origin of the batch holding ``change`` (the object fed)."""
        for _, changes, origin in self._batches:
            if any(c is change for c in changes):
                return origin
        for _, changes, origin in reversed(self._batches):  # made by _expand_sets
            if any(_stands_for(c, change) for c in reversed(changes)):
                return origin
        return 0  # pragma: no cover

    def _one_by_one(self, where: Sequence[str]) -> int:
        """Apply every change fed with ``apply_change`` (a full replay)."""
        apply, applied, read = self._b.apply_change, 0, 0
        for kg, changes, origin in self._batches:
            if kg not in self._b.key_groups:
                read += len(changes)
                continue
            try:
                for c in changes:
                    applied += apply(kg, c)
            except ValueError as e:
                raise ValueError(f"segment at {where[origin]}: {e}") from e
        self.read = read + applied  # value sets changes counted by their entries
        return applied


def _sets_entries(change: Any) -> tuple[bytes, dict[Any, Any]]:
    """(state name bytes, entries) of a value sets change as the backend writes it
    (``[OP_VALUE_SETS, name, {key: value | nil}]``, a str name, a non-empty map);
    raises _Irregular, or a parse error, for anything else."""
    first = change[2]
    if change[0] != 0x93 or not (0xA0 <= first <= 0xBF or 0xD9 <= first <= 0xDB):
        raise _Irregular
    p = _NAME_END[first] or _item_end(change, 2)
    entries = unpackb(change[p:])
    if type(entries) is not dict or not entries:
        raise _Irregular
    return bytes(change[2:p]), entries


def _stands_for(sets: Any, change: Any) -> bool:
    """Whether ``change`` is one the value sets change ``sets`` stands for (as
    :meth:`BulkReplay._expand_sets` builds them); False for any other change."""
    try:
        if sets[1] != OP_VALUE_SETS:
            return False
        name, entries = _sets_entries(sets)
    except (_Irregular, *_PARSE_ERRORS):
        return False
    return any(
        change == (_CLEAR_HEAD + name + kb if vb is None else _SET_HEAD + name + kb + vb)
        for kb, vb in entries.items()
        if type(kb) is bytes and (vb is None or type(vb) is bytes)
    )


def _user_key_at(skuk: Any) -> int:
    """The offset of the user key in a map change's state+key+user key bytes."""
    n = _SIZE[skuk[0]]
    p = n if n else _item_end(skuk, 0)
    n = _SIZE[skuk[p]]
    return p + n if n else _item_end(skuk, p)


def _write_list(
    pack: Callable[[Any], bytes], bucket: dict[bytes, Any], kb: bytes, skl: int, item: list[Any]
) -> int:
    """Apply a list's kept changes (its last clear or update, then adds) in order."""
    lst = bucket.get(kb)
    for c in item:
        op = c[1]
        if op == OP_LIST_ADD:
            vb = pack(unpackb(c[2 + skl :], strict_map_key=False))
            if lst is None:
                lst = bucket[kb] = [vb]
            else:
                lst.append(vb)
        elif op == OP_LIST_SET:
            values = [pack(v) for v in unpackb(c[2 + skl :], strict_map_key=False)]
            if values:
                lst = bucket[kb] = values
            else:
                bucket.pop(kb, None)
                lst = None
        else:
            bucket.pop(kb, None)
            lst = None
    return len(item)
