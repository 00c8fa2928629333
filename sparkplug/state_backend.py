"""A keyed state backend for Python tasks whose every update goes to the changelog.

The task sets the *current key* once per record (:meth:`KeyedStateBackend.set_current_key`,
which computes its key group); value, map and list state handles then act on that key.
Keys follow :mod:`dstltree.sparkplug.keygroups` (None, bool, int, str, bytes, tuples).

Storage: per state name, per key group, the key's canonical encoding
(:func:`~dstltree.sparkplug.keygroups.encode_key`) maps to the msgpack encoding of its
state: bytes (value state), a dict of encoded user key -> encoded value (map state) or
a list of encoded values (list state). Getters decode, so they return fresh objects
(mutating one changes nothing until it is written back) and live state reads exactly
like restored state (tuples inside values come back as lists, as after any msgpack
round trip). Values: anything msgpack encodes (dicts inside values need hashable
keys, not tuples).

Changes: every mutation appends one change to the writer, in the current key's group,
msgpack ``[op, state, key, ...]`` with ``op`` one of ``OP_*``: ``[OP_VALUE_SET, s, k,
v]``, ``[OP_VALUE_CLEAR, s, k]``, ``[OP_MAP_PUT, s, k, uk, v]``, ``[OP_MAP_REMOVE, s, k,
uk]``, ``[OP_MAP_CLEAR, s, k]``, ``[OP_LIST_ADD, s, k, v]``, ``[OP_LIST_CLEAR, s, k]``,
``[OP_LIST_SET, s, k, [v, ...]]``. Value state staged in a writer's last-wins dicts
logs ``[OP_VALUE_SETS, s, {k: v | nil, ...}]`` instead, one change per state, key group
and fold, whose map holds each key's encoding as bin and its value's encoding as bin,
or nil for a clear: the same state on replay as those keys' last sets and clears.

Snapshot (materialization, version ``SNAPSHOT_VERSION``): msgpack ``{"v", "max_parallelism",
"kinds": {state: "value"|"map"|"list"}, "groups": [[key_group, blob], ...]}``, one blob
per key group holding msgpack ``[[state, {encoded key: stored state}], ...]``, so that a
restore decodes only the key groups it owns. Snapshot parts (version ``PART_VERSION``,
the files of an incremental materialization, :mod:`dstltree.sparkplug.materialize`):
the same map plus ``"delta"``; a whole part replaces the state of its groups, a delta
sets the keys it holds and removes those stored as None. For them the backend tracks,
once a materializer asks (:meth:`KeyedStateBackend.track_changes`), per key group the
keys written since the group's last capture (:meth:`KeyedStateBackend.capture_group`),
and captures a frozen group before its next
write (copy-on-write). Restore is snapshot plus replay of the
changelog handles recorded after it (docs/design.md, Data flow 7-8;
:mod:`dstltree.sparkplug.restore`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack

from dstltree.client.writer import ChangelogWriter, LastWins
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM, canonical_key, check_key

(
    OP_VALUE_SET,
    OP_VALUE_CLEAR,
    OP_MAP_PUT,
    OP_MAP_REMOVE,
    OP_MAP_CLEAR,
    OP_LIST_ADD,
    OP_LIST_CLEAR,
    OP_LIST_SET,
    OP_VALUE_SETS,
) = range(9)
VALUE, MAP, LIST = "value", "map", "list"
_OP_KIND = {
    OP_VALUE_SET: VALUE,
    OP_VALUE_CLEAR: VALUE,
    OP_MAP_PUT: MAP,
    OP_MAP_REMOVE: MAP,
    OP_MAP_CLEAR: MAP,
    OP_LIST_ADD: LIST,
    OP_LIST_CLEAR: LIST,
    OP_LIST_SET: LIST,
    OP_VALUE_SETS: VALUE,
}
SNAPSHOT_VERSION = 2
PART_VERSION = 3  # a file of an incremental materialization (:meth:`capture_group`)
_MERGE, _REPLACE, _DELTA = range(3)  # how a snapshot's groups join the state
FOLD_RECORDS = 1024  # records between two hand-overs of staged changes to the writer
_NEVER = 1 << 62  # the record countdown of a backend without a writer's staging
_DECODE_ERRORS = (KeyError, TypeError, ValueError, IndexError, msgpack.UnpackException)
_EMPTY: dict[bytes, Any] = {}  # read-only stand-in for an absent key group bucket

# per state: key group -> encoded key -> stored state
Groups = dict[int, dict[bytes, Any]]


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, strict_map_key=False)


def _prefix(pack: Any, op: int, name: str, fields: int) -> bytes:
    """The encoding of ``[op, name`` for a change of ``fields`` array items (fixarray)."""
    return bytes([0x90 | fields]) + pack(op) + pack(name)


class KeyedStateBackend:
    """Value, map and list state of the key groups ``key_groups`` (a step-1 range in
    [0, max_parallelism)); every mutation appends one change to ``writer`` (None: no
    changelog, e.g. when only restoring). Not thread-safe: one task thread uses it.
    Raises ValueError for a bad ``key_groups``.

    With a :class:`~dstltree.client.writer.ChangelogWriter`, changes go to the writer's
    staging of the current key group (no lock, no writer call per change): value state
    to its last-wins dicts (of a key's changes between two folds only the last one is
    logged), map and list state to its staging lists; the writer folds them in before
    any SQN call, and the backend hands them over every ``FOLD_RECORDS`` records
    (``set_current_key``) so that pre-emptive uploads and back-pressure keep working.
    Any other writer object gets ``append(key_group, change)`` per change."""

    def __init__(
        self,
        key_groups: range,
        writer: ChangelogWriter | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> None:
        if key_groups.step != 1 or not 0 <= key_groups.start <= key_groups.stop <= max_parallelism:
            raise ValueError(f"key groups {key_groups} are not a range in [0, {max_parallelism})")
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        packer = msgpack.Packer()
        self._pack = packer.pack
        self._pack_array_header = packer.pack_array_header
        self._states: dict[str, Groups] = {}
        self._kinds: dict[str, str] = {}
        self._handles: dict[str, _KeyedState] = {}
        self._key: Any = None
        self._kb = b""  # the current key's encoding
        self._kg = -1  # the current key's group; -1: no current key
        # incremental materialization: per key group the keys written since their last
        # capture (None until a materializer tracks them: nothing to keep otherwise),
        # and which groups must be captured before their next write
        self._dirty: list[set[bytes]] | None = None
        self._frozen = bytearray(max_parallelism)
        self.on_frozen_write: Callable[[int], None] | None = None
        self.writer = writer

    @property
    def writer(self) -> ChangelogWriter | None:
        """The changelog writer (None: no changelog); may be replaced between records."""
        return self._writer

    @writer.setter
    def writer(self, writer: ChangelogWriter | None) -> None:
        self._writer = writer
        # per key group: its staging list (None: not looked up yet); None: no staging
        self._outs: list[list[bytes] | None] | None = (
            [None] * self.max_parallelism if isinstance(writer, ChangelogWriter) else None
        )
        self._left = FOLD_RECORDS if self._outs is not None else _NEVER
        for h in self._handles.values():
            if isinstance(h, ValueState):
                h.reset_staging()

    # -- current key ---------------------------------------------------------------------
    def set_current_key(self, key: Any) -> None:
        """Make ``key`` the key state handles act on (once per record). Raises KeyError
        if its key group is not in ``key_groups``, TypeError / ValueError for a value
        that is not a key (:func:`~dstltree.sparkplug.keygroups.check_key`)."""
        if type(key) is not str:
            check_key(key)
        kb = self._pack(key)
        kg = zlib.crc32(kb) % self.max_parallelism
        if kg not in self.key_groups:
            raise KeyError(f"key {key!r} is in key group {kg}, not owned here ({self.key_groups})")
        self._key, self._kb, self._kg = key, kb, kg
        self._left -= 1  # _NEVER without a writer's staging: one decrement, no test of it
        if self._left <= 0:
            self.flush_changes()

    def flush_changes(self) -> None:
        """Hand the staged changes to the writer now (pre-emptive upload and
        back-pressure included: may block). ``set_current_key`` does it every
        ``FOLD_RECORDS`` records and the writer before any SQN call, so a task never
        needs to. Raises DstlError if the writer is closed."""
        if self._outs is None:
            self._left = _NEVER
            return
        self._left = FOLD_RECORDS
        assert self._writer is not None
        self._writer.flush_staged()

    @property
    def current_key(self) -> Any:
        """The current key (None before the first ``set_current_key``, or the None key)."""
        return self._key

    @property
    def current_key_group(self) -> int:
        """The current key's group, -1 before the first ``set_current_key``."""
        return self._kg

    # -- state handles -------------------------------------------------------------------
    def value_state(self, name: str) -> ValueState:
        """The value state ``name`` (created empty if new). Raises ValueError if
        ``name`` is another kind of state."""
        h = self._handle(name, VALUE)
        assert isinstance(h, ValueState)
        return h

    def map_state(self, name: str) -> MapState:
        """The map state ``name`` (created empty if new). Raises ValueError if ``name``
        is another kind of state."""
        h = self._handle(name, MAP)
        assert isinstance(h, MapState)
        return h

    def list_state(self, name: str) -> ListState:
        """The list state ``name`` (created empty if new). Raises ValueError if
        ``name`` is another kind of state."""
        h = self._handle(name, LIST)
        assert isinstance(h, ListState)
        return h

    def state_names(self) -> list[str]:
        """Names of every declared or restored state, sorted."""
        return sorted(self._kinds)

    def state_kind(self, name: str) -> str:
        """``"value"``, ``"map"`` or ``"list"``. Raises KeyError for an unknown state."""
        return self._kinds[name]

    def items(self, name: str) -> Iterator[tuple[Any, Any]]:
        """Every (key, state) of state ``name`` (none for an unknown name): a value, a
        dict (map state) or a list (list state), decoded; keys as
        :func:`~dstltree.sparkplug.keygroups.canonical_key` gives them."""
        kind = self._kinds.get(name)
        if kind is None:
            return
        for bucket in self._states[name].values():
            for kb, stored in bucket.items():
                yield canonical_key(_unpack(kb)), _decode(kind, stored)

    # -- snapshot / restore --------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The whole state as bytes (materialization; format in the module docstring)."""
        per_kg: dict[int, list[list[Any]]] = {}
        for name, groups in self._states.items():
            for kg, bucket in groups.items():
                if bucket:
                    per_kg.setdefault(kg, []).append([name, bucket])
        doc = {
            "v": SNAPSHOT_VERSION,
            "max_parallelism": self.max_parallelism,
            "kinds": self._kinds,
            "groups": [[kg, self._pack(per_kg[kg])] for kg in sorted(per_kg)],
        }
        data: bytes = self._pack(doc)
        return data

    # -- incremental materialization (sparkplug/materialize.py) --------------------------
    def track_changes(self) -> list[set[bytes]]:
        """Keep, per key group, the keys written from now on until their capture (a
        materializer calls it once; idempotent); returns those sets."""
        if self._dirty is None:
            self._dirty = [set() for _ in range(self.max_parallelism)]
        return self._dirty

    def dirty_groups(self) -> list[int]:
        """The key groups with keys written since their last capture, ascending."""
        dirty = self.track_changes()
        return [kg for kg in self.key_groups if dirty[kg]]

    def freeze(self, key_groups: Iterable[int]) -> None:
        """Mark ``key_groups`` for capture: the next write to one of them first calls
        ``on_frozen_write(key_group)``, which must capture it (copy-on-write)."""
        for kg in key_groups:
            self._frozen[kg] = 1

    def capture_group(self, kg: int, full: bool) -> tuple[list[list[Any]], set[bytes]]:
        """Capture key group ``kg`` now, unfreezing it: per state ``[state, entries,
        keys]`` for :meth:`pack_group`, of every key when ``full``, else of the keys
        written since the last capture only. Cheap: a copy of pointers (values are
        immutable bytes; maps and lists, which the task changes in place, are copied
        one level), of the whole bucket (for value state always: a C-level copy is
        cheaper than a loop over even a few keys) unless few of a map or list
        state's keys are wanted; the keys are picked when packing. Also returns the
        keys written since the last capture (no longer dirty; :meth:`mark_dirty`
        gives them back if the capture is abandoned)."""
        dirty = self.track_changes()
        keys, dirty[kg] = dirty[kg], set()
        self._frozen[kg] = 0
        out: list[list[Any]] = []
        for name, groups in self._states.items():
            bucket = groups.get(kg) or _EMPTY
            copy = _COPY[self._kinds[name]]
            if full:
                if bucket:
                    out.append([name, copy(bucket), None])
            elif keys and copy is not dict and 8 * len(keys) < len(bucket):
                get = bucket.get  # maps, lists: copy only the few wanted
                out.append([name, copy({kb: get(kb) for kb in keys}), keys])
            elif keys:  # values: a C-level copy of the bucket beats a loop over keys
                out.append([name, copy(bucket), keys])
        return out, keys

    def pack_group(self, captured: list[list[Any]]) -> bytes:
        """The msgpack blob (the snapshot format of a key group: ``[[state, {encoded
        key: stored state}], ...]``, a key of a delta no longer present stored as None,
        removed) of a :meth:`capture_group` result; b"" for nothing."""
        out = []
        for name, entries, keys in captured:
            if keys is not None:
                get = entries.get
                entries = {kb: get(kb) for kb in keys}
            out.append([name, entries])
        return self._pack(out) if out else b""

    def thaw(self, key_groups: Iterable[int]) -> None:
        """Unfreeze ``key_groups`` without capturing them (an abandoned capture)."""
        for kg in key_groups:
            self._frozen[kg] = 0

    def has_state(self, kg: int) -> bool:
        """Key group ``kg`` holds some state."""
        return any(groups.get(kg) for groups in self._states.values())

    def mark_dirty(self, kg: int, keys: set[bytes]) -> None:
        """Give back keys of an abandoned capture: written since the last capture that
        will be referenced."""
        self.track_changes()[kg] |= keys

    def part(self, groups: list[tuple[int, bytes]], delta: bool) -> bytes:
        """A snapshot part (version :data:`PART_VERSION`) of captured ``groups``
        ((key group, blob), ascending): their whole state, or a ``delta``."""
        doc = {
            "v": PART_VERSION,
            "max_parallelism": self.max_parallelism,
            "kinds": self._kinds,
            "delta": delta,
            "groups": [[kg, blob] for kg, blob in groups],
        }
        data: bytes = self._pack(doc)
        return data

    def restore_snapshot(self, data: bytes) -> None:
        """Merge the key groups of snapshot ``data`` that lie in ``key_groups`` into this
        state (others are skipped undecoded); a key present in both takes the
        snapshot's state. A snapshot part (:data:`PART_VERSION`) replaces the whole
        state of each of its groups, or, a delta, sets the keys it holds and removes
        those it records as removed. Raises ValueError ("bad state snapshot: ...") for
        a corrupt snapshot, a version this code does not know (a newer one's, named),
        another max_parallelism, or a kind clash."""
        try:
            doc = msgpack.unpackb(data, strict_map_key=False)
            if not isinstance(doc, dict):
                raise TypeError(f"a {type(doc).__name__}, not a map")
            version = doc.get("v")
            if version not in (SNAPSHOT_VERSION, PART_VERSION):
                raise ValueError(
                    f"state snapshot format version {version!r}, expected {SNAPSHOT_VERSION} "
                    f"({PART_VERSION} for a part): unknown to this dstltree (a newer one's?)"
                )
            mode = _MERGE if version == SNAPSHOT_VERSION else _DELTA if doc["delta"] else _REPLACE
            if doc["max_parallelism"] != self.max_parallelism:
                raise ValueError(
                    f"taken with max_parallelism {doc['max_parallelism']}, "
                    f"restoring with {self.max_parallelism}"
                )
            kinds = doc["kinds"]
            for name, kind in kinds.items():
                self._declare(name, kind)
            for kg, blob in doc["groups"]:
                if type(kg) is not int or not 0 <= kg < self.max_parallelism:
                    raise ValueError(f"key group {kg!r} outside [0, {self.max_parallelism})")
                if kg in self.key_groups:
                    self._restore_group(kg, blob, kinds, mode)
        except _DECODE_ERRORS as e:
            raise ValueError(f"bad state snapshot: {e}") from e

    def apply_change(self, key_group: int, change: bytes) -> int:
        """Replay one changelog change of ``key_group`` (recovery); a change of a key
        group not in ``key_groups`` is ignored. Returns the state changes applied: 1, or
        a value sets change's entries, 0 when ignored. Raises ValueError ("bad state
        change ...") for a malformed change, an operation this code does not know (a
        newer version's, named), a kind clash, or a key that does not hash to
        ``key_group`` (a changelog of another max_parallelism)."""
        if key_group not in self.key_groups:
            return 0
        try:
            op, name, key, *rest = msgpack.unpackb(change, strict_map_key=False)
            if op == OP_VALUE_SETS:
                return self._apply_sets(key_group, name, key, rest)
            kind = _OP_KIND.get(op) if type(op) is int else None
            if kind is None:
                raise ValueError(
                    f"state change operation {op!r} is unknown to this dstltree (it reads "
                    f"{min(_OP_KIND)}..{max(_OP_KIND)}); written by a newer version?"
                )
            groups = self._declare(name, kind)
            kb = self._pack(key)
            self._check_group(kb, key_group)
            bucket = groups.get(key_group)
            if bucket is None:
                bucket = groups[key_group] = {}
            self._replay(op, bucket, kb, rest)
        except _DECODE_ERRORS as e:
            raise ValueError(f"bad state change in key group {key_group}: {e}") from e
        return 1

    def _apply_sets(self, kg: int, name: Any, entries: Any, rest: list[Any]) -> int:
        """Replay ``[OP_VALUE_SETS, name, entries]``: every entry is decoded and checked
        before any is stored. Returns the entries. Raises TypeError / ValueError
        (msgpack's included) for a malformed one, as :meth:`apply_change` does for one
        change."""
        if rest or type(entries) is not dict:
            raise TypeError("value sets must be [op, state, {key: value | nil}]")
        pack, kept = self._pack, []
        for kb, vb in entries.items():
            if type(kb) is not bytes or not (vb is None or type(vb) is bytes):
                raise TypeError("a value sets entry must map bin to bin or nil")
            kb = pack(_unpack(kb))
            self._check_group(kb, kg)
            kept.append((kb, None if vb is None else pack(_unpack(vb))))
        bucket = self.replay_bucket(name, VALUE, kg)
        for kb, vb in kept:
            if vb is None:
                bucket.pop(kb, None)
            else:
                bucket[kb] = vb
        return len(kept)

    def replay_bucket(self, name: str, kind: str, key_group: int) -> dict[bytes, Any]:
        """For bulk replay (:mod:`dstltree.sparkplug.replay`): the live bucket of state
        ``name`` (declared as ``kind``) in ``key_group``, encoded key -> stored state
        (module docstring), created empty if absent, to be written in place with what
        a replay of changes would store (the caller checks the keys' key groups and
        drops emptied maps and lists). Raises ValueError on a kind clash, KeyError for
        a key group not in ``key_groups``."""
        if key_group not in self.key_groups:
            raise KeyError(f"key group {key_group} is not owned here ({self.key_groups})")
        groups = self._declare(name, kind)
        bucket = groups.get(key_group)
        if bucket is None:
            bucket = groups[key_group] = {}
        return bucket

    # -- internals -----------------------------------------------------------------------
    def _staging(self, kg: int) -> list[bytes] | None:
        """The writer's staging list of ``kg``, kept for the next records; None if ``kg``
        is outside the writer's range (its ``append`` then raises ValueError per change,
        as without staging)."""
        assert self._outs is not None and self._writer is not None
        if kg not in self._writer.key_groups:
            return None
        out = self._outs[kg] = self._writer.staging(kg)
        return out

    def _emit(self, change: bytes) -> None:
        """Log ``change`` of the current key group: staged in the writer's list of that
        key group, else appended (which raises ValueError outside the writer's range)."""
        outs = self._outs
        if outs is not None:
            out = outs[self._kg]
            if out is not None or (out := self._staging(self._kg)) is not None:
                out.append(change)
                return
        if self._writer is not None:
            self._writer.append(self._kg, change)

    def _handle(self, name: str, kind: str) -> _KeyedState:
        self._declare(name, kind)
        h = self._handles.get(name)
        if h is None:
            cls = _HANDLE_CLASSES[kind]
            h = self._handles[name] = cls(self, name)
        return h

    def _declare(self, name: str, kind: str) -> Groups:
        if type(name) is not str:
            raise TypeError(f"state name {name!r} is not a str")
        if kind not in _HANDLE_CLASSES:
            raise ValueError(f"unknown state kind {kind!r}")
        if self._kinds.setdefault(name, kind) != kind:
            raise ValueError(f"state {name!r} is a {self._kinds[name]} state, not a {kind} state")
        groups = self._states.get(name)
        if groups is None:
            groups = self._states[name] = {}
        return groups

    def _check_group(self, kb: bytes, kg: int) -> None:
        actual = zlib.crc32(kb) % self.max_parallelism
        if actual != kg:
            raise ValueError(
                f"key {canonical_key(_unpack(kb))!r} is stored in key group {kg} but hashes "
                f"to {actual} (state of another max_parallelism?)"
            )

    def _restore_group(self, kg: int, blob: bytes, kinds: dict[str, str], mode: int) -> None:
        if mode == _REPLACE:
            for groups in self._states.values():
                groups.pop(kg, None)
        for name, entries in _unpack(blob):
            kind = kinds[name]
            if not isinstance(entries, dict):
                raise TypeError(f"state {name!r} of key group {kg} is not a map")
            removed = []
            for kb, stored in entries.items():
                if stored is None and mode == _DELTA and type(kb) is bytes:
                    removed.append(kb)
                elif type(kb) is not bytes or not _valid_stored(kind, stored):
                    raise TypeError(f"bad {kind} entry in state {name!r} of key group {kg}")
                self._check_group(kb, kg)
            groups = self._states[name]
            bucket = groups.get(kg)
            if bucket is None:
                bucket = groups[kg] = entries
            else:
                bucket.update(entries)
            for kb in removed:
                del bucket[kb]

    def _replay(self, op: int, bucket: dict[bytes, Any], kb: bytes, rest: list[Any]) -> None:
        pack = self._pack
        if op == OP_VALUE_SET:
            bucket[kb] = pack(rest[0])
        elif op == OP_MAP_PUT:
            m = bucket.get(kb)
            if m is None:
                m = bucket[kb] = {}
            m[pack(rest[0])] = pack(rest[1])
        elif op == OP_MAP_REMOVE:
            m = bucket.get(kb)
            if m is not None:
                m.pop(pack(rest[0]), None)
                if not m:
                    del bucket[kb]
        elif op == OP_LIST_ADD:
            lst = bucket.get(kb)
            if lst is None:
                bucket[kb] = [pack(rest[0])]
            else:
                lst.append(pack(rest[0]))
        elif op == OP_LIST_SET:
            values = [pack(v) for v in rest[0]]
            if values:
                bucket[kb] = values
            else:
                bucket.pop(kb, None)
        else:  # OP_VALUE_CLEAR, OP_MAP_CLEAR, OP_LIST_CLEAR
            bucket.pop(kb, None)

    def _read_bucket(self, groups: Groups) -> dict[bytes, Any]:
        bucket = groups.get(self._kg)
        if bucket is None:
            if self._kg < 0:
                raise _no_current_key()
            return _EMPTY
        return bucket

    def _write_bucket(self, groups: Groups) -> dict[bytes, Any]:
        """The current key's bucket, about to be written: a group frozen for a
        materialization is captured first (copy-on-write); the key is marked dirty."""
        kg = self._kg
        bucket = groups.get(kg)
        if bucket is None:
            if kg < 0:
                raise _no_current_key()
            bucket = groups[kg] = {}
        if self._frozen[kg]:
            assert self.on_frozen_write is not None
            self.on_frozen_write(kg)
        dirty = self._dirty
        if dirty is not None:
            dirty[kg].add(self._kb)
        return bucket


def _no_current_key() -> RuntimeError:
    return RuntimeError("no current key: keyed state is used outside processing a record")


def _valid_stored(kind: str, stored: Any) -> bool:
    if kind == VALUE:
        return type(stored) is bytes
    if kind == MAP:
        return type(stored) is dict and all(
            type(k) is bytes and type(v) is bytes for k, v in stored.items()
        )
    return type(stored) is list and all(type(v) is bytes for v in stored)


def _decode(kind: str, stored: Any) -> Any:
    if kind == VALUE:
        return _unpack(stored)
    if kind == MAP:
        return {canonical_key(_unpack(k)): _unpack(v) for k, v in stored.items()}
    return [_unpack(v) for v in stored]


class _KeyedState:
    """A state handle bound to the backend's current key."""

    __slots__ = ("_b", "name", "_groups")

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._b = backend
        self.name = name
        self._groups = backend._states[name]

    def _log(self, *parts: bytes) -> None:
        b = self._b
        if b._writer is not None:
            b._emit(b"".join(parts))


class ValueState(_KeyedState):
    """One value per key: ``get() -> value | None``, ``set(value)``, ``clear()``, on the
    backend's current key. Each ``set``/``clear`` logs one change; with a
    :class:`~dstltree.client.writer.ChangelogWriter` they go to its last-wins staging
    (``ChangelogWriter.last_wins``), so of a key's changes between two folds only the
    last one is logged, and the fold logs them all as one ``OP_VALUE_SETS`` change (the
    same state on replay, fewer bytes, no work per entry in Python)."""

    __slots__ = ("_p_set", "_p_clear", "_p_sets", "_lw")

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        super().__init__(backend, name)
        self._p_set = _prefix(backend._pack, OP_VALUE_SET, name, 4)
        self._p_clear = _prefix(backend._pack, OP_VALUE_CLEAR, name, 3)
        self._p_sets = _prefix(backend._pack, OP_VALUE_SETS, name, 3)
        self.reset_staging()

    def reset_staging(self) -> None:
        """Forget the writer's last-wins dicts (the backend's writer changed)."""
        b = self._b
        w = b._writer
        staging = isinstance(w, ChangelogWriter) and w.squash_entries > 0
        self._lw: list[LastWins | None] | None = [None] * b.max_parallelism if staging else None

    def _last_wins(self, kg: int) -> LastWins:
        assert self._lw is not None and isinstance(self._b._writer, ChangelogWriter)
        d = self._lw[kg] = self._b._writer.last_wins(kg, self._p_sets)
        return d

    def get(self) -> Any:
        """The current key's value (a fresh decoded object), None if unset. Raises
        RuntimeError without a current key."""
        b = self._b
        vb = b._read_bucket(self._groups).get(b._kb)
        return None if vb is None else _unpack(vb)

    def set(self, value: Any) -> None:
        """Set the current key's value (msgpack-encodable; TypeError otherwise)."""
        b = self._b
        bucket = b._write_bucket(self._groups)
        vb = b._pack(value)
        kb = b._kb
        bucket[kb] = vb
        lw = self._lw
        if lw is not None:
            d = lw[b._kg]
            if d is None:
                d = self._last_wins(b._kg)
            d[kb] = vb
        elif b._writer is not None:
            b._emit(self._p_set + kb + vb)

    def clear(self) -> None:
        """Remove the current key's value."""
        b = self._b
        b._write_bucket(self._groups).pop(b._kb, None)
        lw = self._lw
        if lw is not None:
            d = lw[b._kg]
            (self._last_wins(b._kg) if d is None else d)[b._kb] = None
        else:
            self._log(self._p_clear, b._kb)


class MapState(_KeyedState):
    """A map of user keys (hashable msgpack values) to values per key, on the backend's
    current key. An emptied map is no state. Each ``put``/``remove``/``clear`` appends
    one change."""

    __slots__ = ("_p_put", "_p_remove", "_p_clear")

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        super().__init__(backend, name)
        self._p_put = _prefix(backend._pack, OP_MAP_PUT, name, 5)
        self._p_remove = _prefix(backend._pack, OP_MAP_REMOVE, name, 4)
        self._p_clear = _prefix(backend._pack, OP_MAP_CLEAR, name, 3)

    def _map(self) -> dict[bytes, bytes]:
        b = self._b
        m: dict[bytes, bytes] | None = b._read_bucket(self._groups).get(b._kb)
        return _EMPTY if m is None else m

    def get(self, user_key: Any, default: Any = None) -> Any:
        """The value of ``user_key`` (decoded), ``default`` if absent."""
        vb = self._map().get(self._b._pack(user_key))
        return default if vb is None else _unpack(vb)

    def contains(self, user_key: Any) -> bool:
        return self._b._pack(user_key) in self._map()

    def put(self, user_key: Any, value: Any) -> None:
        """Map ``user_key`` to ``value``. Raises TypeError for an unhashable user key
        or a value msgpack cannot encode."""
        hash(user_key)
        b = self._b
        bucket = b._write_bucket(self._groups)
        ukb, vb = b._pack(user_key), b._pack(value)
        m = bucket.get(b._kb)
        if m is None:
            m = bucket[b._kb] = {}
        m[ukb] = vb
        if b._writer is not None:
            b._emit(b"".join((self._p_put, b._kb, ukb, vb)))

    def remove(self, user_key: Any) -> None:
        """Remove ``user_key`` (absent: no effect, still one change)."""
        b = self._b
        bucket = b._write_bucket(self._groups)
        ukb = b._pack(user_key)
        m = bucket.get(b._kb)
        if m is not None:
            m.pop(ukb, None)
            if not m:
                del bucket[b._kb]
        self._log(self._p_remove, b._kb, ukb)

    def clear(self) -> None:
        """Remove every entry of the current key's map."""
        b = self._b
        b._write_bucket(self._groups).pop(b._kb, None)
        self._log(self._p_clear, b._kb)

    def items(self) -> list[tuple[Any, Any]]:
        """Every (user key, value), in insertion order (tuples as user keys)."""
        return [(canonical_key(_unpack(k)), _unpack(v)) for k, v in self._map().items()]

    def keys(self) -> list[Any]:
        return [canonical_key(_unpack(k)) for k in self._map()]

    def values(self) -> list[Any]:
        return [_unpack(v) for v in self._map().values()]


class ListState(_KeyedState):
    """A list of values per key, on the backend's current key: ``add(v)``, ``get()``,
    ``update(values)``, ``clear()``. Each mutation appends one change."""

    __slots__ = ("_p_add", "_p_clear", "_p_set")

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        super().__init__(backend, name)
        self._p_add = _prefix(backend._pack, OP_LIST_ADD, name, 4)
        self._p_clear = _prefix(backend._pack, OP_LIST_CLEAR, name, 3)
        self._p_set = _prefix(backend._pack, OP_LIST_SET, name, 4)

    def get(self) -> list[Any]:
        """The current key's values in order (decoded; [] if none)."""
        b = self._b
        stored = b._read_bucket(self._groups).get(b._kb)
        return [] if stored is None else [_unpack(v) for v in stored]

    def add(self, value: Any) -> None:
        """Append ``value`` (msgpack-encodable; TypeError otherwise)."""
        b = self._b
        bucket = b._write_bucket(self._groups)
        vb = b._pack(value)
        stored = bucket.get(b._kb)
        if stored is None:
            bucket[b._kb] = [vb]
        else:
            stored.append(vb)
        if b._writer is not None:
            b._emit(self._p_add + b._kb + vb)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's values by ``values`` (one change)."""
        b = self._b
        bucket = b._write_bucket(self._groups)
        encoded = [b._pack(v) for v in values]
        if encoded:
            bucket[b._kb] = encoded
        else:
            bucket.pop(b._kb, None)
        self._log(self._p_set, b._kb, b._pack_array_header(len(encoded)), *encoded)

    def clear(self) -> None:
        """Remove the current key's values."""
        b = self._b
        b._write_bucket(self._groups).pop(b._kb, None)
        self._log(self._p_clear, b._kb)


def _copy_nested(bucket: dict[bytes, Any]) -> dict[bytes, Any]:
    """A bucket of map or list state with each map or list copied (None kept)."""
    return {k: v if v is None else v.copy() for k, v in bucket.items()}


# how a capture copies a bucket of each kind (value state: bytes, immutable)
_COPY: dict[str, Callable[[dict[bytes, Any]], dict[bytes, Any]]] = {
    VALUE: dict,
    MAP: _copy_nested,
    LIST: _copy_nested,
}

_HANDLE_CLASSES: dict[str, type[_KeyedState]] = {
    VALUE: ValueState,
    MAP: MapState,
    LIST: ListState,
}
