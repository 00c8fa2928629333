"""The collector settings of a serving process (client/collector.py)."""

from __future__ import annotations

import gc
import weakref

import pytest

from dstltree.client.collector import YOUNG_THRESHOLD, bulk_load_collector, serving_collector


def test_serving_freezes_what_exists_and_spaces_young_collections() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with serving_collector():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _garbage_cycle() -> weakref.ref[_Cycle]:
    """A weak reference to a cycle nothing else refers to (reference counting alone
    never frees it). No assert on its target: pytest's assertion rewriting would
    hold the object in a local."""
    return weakref.ref(_Cycle())


def test_collections_find_cycles_made_while_serving_not_the_frozen_ones() -> None:
    old = _garbage_cycle()
    with serving_collector():
        young = _garbage_cycle()
        gc.collect()
        young_gone, old_kept = young() is None, old() is not None
    gc.collect()
    old_gone = old() is None
    assert young_gone and old_kept and old_gone


def test_the_settings_are_undone_when_the_loop_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), serving_collector(young_threshold=5_000):
        raise RuntimeError("the loop failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_threshold_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="young_threshold"), serving_collector(0):
        pass
    assert gc.get_freeze_count() == 0


def test_a_bulk_load_runs_no_collection_and_enables_the_collector_again() -> None:
    collections: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        collections.append(phase)

    gc.callbacks.append(seen)
    try:
        with bulk_load_collector():
            assert not gc.isenabled()
            kept = [[] for _ in range(5_000)]  # well past the young threshold
            during = list(collections)
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
    assert during == [] and len(kept) == 5_000


def test_a_bulk_load_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with pytest.raises(RuntimeError), bulk_load_collector():
            raise RuntimeError("the restore failed")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_blocks_undo_the_settings_only_when_the_last_one_exits() -> None:
    before = gc.get_threshold()
    first, second = serving_collector(), serving_collector(young_threshold=30_000)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the task that started first ends first
    assert gc.get_threshold()[0] == 30_000 and gc.get_freeze_count() > 0
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_overlapping_bulk_loads_enable_the_collector_when_the_last_one_exits() -> None:
    assert gc.isenabled()
    first, second = bulk_load_collector(), bulk_load_collector()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # one task's restore ends while another's runs
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()
