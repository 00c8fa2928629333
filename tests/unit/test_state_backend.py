"""Keyed state backend: every update is a change; snapshot + replay restores it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.client import ChangelogClient
from dstltree.sparkplug.keygroups import key_group_of, key_group_range, task_of_key_group
from dstltree.sparkplug.state_backend import KeyedStateBackend


def test_key_group_ranges_partition_all_key_groups() -> None:
    for p in (1, 3, 7, 128):
        seen = [kg for t in range(p) for kg in key_group_range(t, p)]
        assert seen == list(range(128))
        assert all(task_of_key_group(kg, p) == t for t in range(p) for kg in key_group_range(t, p))
    with pytest.raises(ValueError):
        key_group_range(0, 129)


def test_snapshot_plus_replay_restores_state(tmp_path: Path) -> None:
    client = ChangelogClient.open(str(tmp_path))
    kgs = range(0, 128)
    writer = client.create_writer("backend", kgs)
    live = KeyedStateBackend(kgs, writer)
    v, m = live.value_state("count"), live.map_state("last")
    for i in range(200):
        key = f"k{i % 17}"
        v.update(key, (v.get(key) or 0) + 1)
        m.put(key, "i", i)
        if i == 100:
            snap_sqn = writer.next_sqn()
            snapshot = live.snapshot()
    v.clear("k3")
    m.remove("k4", "i")
    handle = writer.persist_durably(after=snap_sqn).result(timeout=10)
    changes = list(client.iter_changes(handle))
    # only what followed the snapshot: 99 iterations x (update + put), a clear, a remove
    assert len(changes) == 99 * 2 + 2
    restored = KeyedStateBackend(kgs)
    restored.restore_snapshot(snapshot)
    at_snapshot = dict(restored.items("count"))
    assert sum(at_snapshot.values()) == 101  # iterations 0..100
    for _, kg, change in changes:
        restored.apply_change(kg, change)
    assert dict(restored.items("count")) == dict(live.items("count"))
    assert dict(restored.items("last")) == dict(live.items("last"))
    counts = dict(restored.items("count"))
    assert "k3" not in counts and sum(counts.values()) == 200 - 12  # k3 counted 12 times
    assert dict(restored.items("last"))["k4"] == {}
    assert dict(restored.items("last"))["k5"] == {"i": 192}  # the last i with i % 17 == 5
    client.close()


def test_backend_rejects_foreign_keys_and_kind_clash() -> None:
    b = KeyedStateBackend(range(0, 1))
    key = next(f"x{i}" for i in range(1000) if key_group_of(f"x{i}") != 0)
    with pytest.raises(KeyError, match="not owned"):
        b.value_state("s").update(key, 1)
    with pytest.raises(ValueError, match="value state"):
        b.map_state("s")
    with pytest.raises(ValueError, match="bad state snapshot"):
        b.restore_snapshot(b"\x00garbage")
