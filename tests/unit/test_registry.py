"""Shared state registry: reference counts per object path (FLINK-7449 documentation)."""

from __future__ import annotations

import pytest

from dstltree.coordinator.registry import SharedStateRegistry
from dstltree.coordinator.testing import completed


def _history() -> list:
    # Like the 4-checkpoint example of the FLINK-7449 docs: objects are re-referenced
    # by later checkpoints until a materialization replaces them.
    return [
        completed(1, {0: ["a", "b"], 1: ["x"]}),
        completed(2, {0: ["a", "b", "c"], 1: ["x", "y"]}),
        completed(3, {0: ["snap0", "c", "d"], 1: ["x", "y", "z"]}),
        completed(4, {0: ["snap0", "d", "e"], 1: ["snap1", "z"]}),
    ]


def test_register_counts_each_path_once_per_checkpoint() -> None:
    reg = SharedStateRegistry()
    cp = completed(1, {0: ["a", "b"], 1: ["a"]})
    reg.register(cp)
    assert reg.counts() == {"a": 1, "b": 1}
    with pytest.raises(ValueError):
        reg.register(cp)


def test_subsume_with_retention_two_deletes_exactly_unreferenced() -> None:
    reg = SharedStateRegistry()
    retained: list = []
    deleted: list[str] = []
    for cp in _history():
        reg.register(cp)
        retained.append(cp)
        while len(retained) > 2:
            deleted += reg.unregister(retained.pop(0))
        live = set().union(*(c.referenced_paths() for c in retained))
        assert reg.referenced() == live
        assert not set(deleted) & live
    assert sorted(deleted) == ["a", "b"]  # c, x, y are still in checkpoint 3
    assert reg.count("snap0") == 2 and reg.count("d") == 2 and reg.count("e") == 1


def test_unregister_unknown_raises() -> None:
    with pytest.raises(KeyError):
        SharedStateRegistry().unregister(7)


def test_rebuild_equals_incremental() -> None:
    history = _history()
    inc = SharedStateRegistry()
    for cp in history:
        inc.register(cp)
    inc.unregister(history[0])
    inc.unregister(history[1])
    rebuilt = SharedStateRegistry.rebuild(history[2:])
    assert rebuilt.counts() == inc.counts()
    assert rebuilt.registered_ids() == inc.registered_ids() == [3, 4]
