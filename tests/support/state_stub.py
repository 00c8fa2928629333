"""A small in-memory stand-in for the keyed state API, to unit-test a user's
``KeyedProcessFunction`` without the runtime: value, map and list state on the current
key, values round-tripped through msgpack as the real backend stores them (tuples come
back as lists, every ``get`` returns a fresh object)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack


def _copy(value: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(value), strict_map_key=False)


class StubContext:
    """``open(ctx)``'s argument: ``states`` is state name -> key -> value (a dict for
    map state, a list for list state); ``current_key`` is set by :func:`run_function`."""

    def __init__(self) -> None:
        self.states: dict[str, dict[Any, Any]] = {}
        self.current_key: Any = None
        self.task, self.parallelism, self.attempt = 0, 1, 0

    def _per_key(self, name: str) -> dict[Any, Any]:
        return self.states.setdefault(name, {})

    def value_state(self, name: str) -> StubValueState:
        return StubValueState(self, name)

    def map_state(self, name: str) -> StubMapState:
        return StubMapState(self, name)

    def list_state(self, name: str) -> StubListState:
        return StubListState(self, name)


class StubValueState:
    def __init__(self, ctx: StubContext, name: str) -> None:
        self.ctx, self.name = ctx, name

    def get(self) -> Any:
        return _copy(self.ctx._per_key(self.name).get(self.ctx.current_key))

    def set(self, value: Any) -> None:
        self.ctx._per_key(self.name)[self.ctx.current_key] = _copy(value)

    def clear(self) -> None:
        self.ctx._per_key(self.name).pop(self.ctx.current_key, None)


class StubMapState:
    def __init__(self, ctx: StubContext, name: str) -> None:
        self.ctx, self.name = ctx, name

    def _map(self) -> dict[Any, Any]:
        return self.ctx._per_key(self.name).setdefault(self.ctx.current_key, {})

    def get(self, key: Any, default: Any = None) -> Any:
        return _copy(self._map().get(key, default))

    def put(self, key: Any, value: Any) -> None:
        self._map()[key] = _copy(value)

    def remove(self, key: Any) -> None:
        self._map().pop(key, None)

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, _copy(v)) for k, v in self._map().items()]


class StubListState:
    def __init__(self, ctx: StubContext, name: str) -> None:
        self.ctx, self.name = ctx, name

    def add(self, value: Any) -> None:
        self.ctx._per_key(self.name).setdefault(self.ctx.current_key, []).append(_copy(value))

    def get(self) -> list[Any]:
        return _copy(self.ctx._per_key(self.name).get(self.ctx.current_key, []))

    def clear(self) -> None:
        self.ctx._per_key(self.name).pop(self.ctx.current_key, None)


class StubCollector:
    """Collects emitted rows in ``rows``."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def emit(self, row: dict[str, Any]) -> None:
        self.rows.append(dict(row))


def run_function(
    function: Any, keyed: Iterable[tuple[Any, dict[str, Any]]]
) -> tuple[dict[str, dict[Any, Any]], list[dict[str, Any]]]:
    """Open ``function`` on a fresh :class:`StubContext` and feed it ``(key, record)``
    pairs in order; returns (state name -> key -> value, emitted rows)."""
    ctx, out = StubContext(), StubCollector()
    function.open(ctx)
    for key, record in keyed:
        ctx.current_key = key
        function.process(key, record, out)
    return ctx.states, out.rows
