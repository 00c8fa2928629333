"""A keyed state backend for Python tasks whose every update goes to the changelog.

State is kept in memory per key group; each update is appended to the task's
changelog writer as one change (msgpack ``[op, state, key, ...]``) in the key's key
group. Materialization serializes the whole state (a snapshot); restore is snapshot
plus replay of the changelog handles recorded after it (docs/design.md, Data flow 7-8).
Values must be msgpack-serializable (None, bool, int, float, str, bytes, lists, maps).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack

from dstltree.client.writer import ChangelogWriter
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM, key_group_of

_PUT, _DEL, _MPUT, _MDEL = 0, 1, 2, 3
SNAPSHOT_VERSION = 1


class KeyedStateBackend:
    """Value and map state of the key groups ``key_groups``; changes go to ``writer``
    (None: no changelog, e.g. when only restoring)."""

    def __init__(
        self,
        key_groups: range,
        writer: ChangelogWriter | None = None,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> None:
        self.key_groups = key_groups
        self.writer = writer
        self.max_parallelism = max_parallelism
        # state name -> key group -> key -> value (map state: value is a dict)
        self._states: dict[str, dict[int, dict[str, Any]]] = {}
        self._kinds: dict[str, str] = {}

    def value_state(self, name: str) -> ValueState:
        self._declare(name, "value")
        return ValueState(self, name)

    def map_state(self, name: str) -> MapState:
        self._declare(name, "map")
        return MapState(self, name)

    def key_group(self, key: str) -> int:
        kg = key_group_of(key, self.max_parallelism)
        if kg not in self.key_groups:
            raise KeyError(f"key {key!r} is in key group {kg}, not owned here ({self.key_groups})")
        return kg

    # -- snapshot / restore --------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The whole state as bytes (materialization)."""
        return msgpack.packb(
            {"v": SNAPSHOT_VERSION, "kinds": self._kinds, "states": self._states},
            strict_types=False,
        )

    def restore_snapshot(self, data: bytes) -> None:
        """Replace the state with a snapshot (raises ValueError for a bad snapshot)."""
        try:
            doc = msgpack.unpackb(data, strict_map_key=False)
            if doc["v"] != SNAPSHOT_VERSION:
                raise ValueError(f"snapshot version {doc['v']}")
            self._kinds = dict(doc["kinds"])
            self._states = {
                name: {int(kg): keys for kg, keys in per_kg.items()}
                for name, per_kg in doc["states"].items()
            }
        except (KeyError, TypeError, ValueError, msgpack.UnpackException) as e:
            raise ValueError(f"bad state snapshot: {e}") from e

    def apply_change(self, key_group: int, change: bytes) -> None:
        """Replay one changelog change (recovery)."""
        op, name, key, *rest = msgpack.unpackb(change, strict_map_key=False)
        per_key = self._states.setdefault(name, {}).setdefault(key_group, {})
        if op == _PUT:
            per_key[key] = rest[0]
        elif op == _DEL:
            per_key.pop(key, None)
        elif op == _MPUT:
            per_key.setdefault(key, {})[rest[0]] = rest[1]
        elif op == _MDEL:
            per_key.get(key, {}).pop(rest[0], None)
        else:
            raise ValueError(f"unknown change op {op}")

    def items(self, name: str) -> Iterator[tuple[str, Any]]:
        """Every (key, value) of state ``name``."""
        for per_key in self._states.get(name, {}).values():
            yield from per_key.items()

    # -- internals -----------------------------------------------------------------------
    def _declare(self, name: str, kind: str) -> None:
        if self._kinds.setdefault(name, kind) != kind:
            raise ValueError(f"state {name!r} is a {self._kinds[name]} state, not {kind}")
        self._states.setdefault(name, {})

    def _bucket(self, name: str, key: str) -> tuple[int, dict[str, Any]]:
        kg = self.key_group(key)
        return kg, self._states[name].setdefault(kg, {})

    def _log(self, kg: int, *change: Any) -> None:
        if self.writer is not None:
            self.writer.append(kg, msgpack.packb(list(change)))


class ValueState:
    """One value per key."""

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._b, self.name = backend, name

    def get(self, key: str, default: Any = None) -> Any:
        return self._b._bucket(self.name, key)[1].get(key, default)

    def update(self, key: str, value: Any) -> None:
        kg, bucket = self._b._bucket(self.name, key)
        bucket[key] = value
        self._b._log(kg, _PUT, self.name, key, value)

    def clear(self, key: str) -> None:
        kg, bucket = self._b._bucket(self.name, key)
        bucket.pop(key, None)
        self._b._log(kg, _DEL, self.name, key)


class MapState:
    """A map of user keys to values per key."""

    def __init__(self, backend: KeyedStateBackend, name: str) -> None:
        self._b, self.name = backend, name

    def get(self, key: str, user_key: str, default: Any = None) -> Any:
        return self._b._bucket(self.name, key)[1].get(key, {}).get(user_key, default)

    def put(self, key: str, user_key: str, value: Any) -> None:
        kg, bucket = self._b._bucket(self.name, key)
        bucket.setdefault(key, {})[user_key] = value
        self._b._log(kg, _MPUT, self.name, key, user_key, value)

    def remove(self, key: str, user_key: str) -> None:
        kg, bucket = self._b._bucket(self.name, key)
        bucket.get(key, {}).pop(user_key, None)
        self._b._log(kg, _MDEL, self.name, key, user_key)

    def items(self, key: str) -> Iterator[tuple[str, Any]]:
        yield from self._b._bucket(self.name, key)[1].get(key, {}).items()
