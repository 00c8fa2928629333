"""The completed-checkpoint store on DFS: metadata first, LATEST pointer last."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.errors import CorruptCheckpointError
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.testing import completed
from dstltree.storage.store import ObjectStore


def test_round_trip_and_latest(tmp_path: Path) -> None:
    cs = CheckpointStore(ObjectStore(str(tmp_path)))
    assert cs.load_latest() is None and cs.list_retained() == []
    cp1 = completed(1, {0: ["a"], 1: ["b"]})
    path = cs.add(cp1)
    assert path.endswith("checkpoints/chk-0000000001.json")
    assert cs.load_latest() == cp1
    cp2 = completed(2, {0: ["a", "c"], 1: ["b"]})
    cs.add(cp2)
    assert [c.checkpoint_id for c in cs.list_retained()] == [1, 2]
    assert CompletedCheckpoint.from_dict(cp2.to_dict()) == cp2
    # Subsumption is committed with the pointer.
    cs.add(completed(3, {0: ["c"]}), retained=[2])
    assert cs.retained_ids() == [2, 3]
    assert cs.stale_files() == [cs.metadata_path(1)]
    cs.delete(1)
    assert cs.stale_files() == []
    # A new store instance (a restarted driver) sees the same state.
    again = CheckpointStore(ObjectStore(str(tmp_path)))
    assert again.latest_id() == 3 and again.retained_ids() == [2, 3]


def test_crash_between_metadata_and_pointer_keeps_previous(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store)
    cs.add(completed(1, {0: ["a"]}))
    # Only the metadata of checkpoint 2 reached DFS (the process died before LATEST).
    import json

    store.put(cs.metadata_path(2), json.dumps(completed(2, {0: ["b"]}).to_dict()).encode())
    assert cs.latest_id() == 1
    assert [c.checkpoint_id for c in cs.list_retained()] == [1]
    assert cs.stale_files() == [cs.metadata_path(2)]
    # No temporary files are left behind by the atomic writes.
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if ".tmp" in p.name]


def test_delete_latest_rewrites_pointer(tmp_path: Path) -> None:
    cs = CheckpointStore(ObjectStore(str(tmp_path)))
    cs.add(completed(1, {0: ["a"]}))
    cs.add(completed(2, {0: ["b"]}))
    cs.delete(2)
    assert cs.latest_id() == 1
    cs.delete(1)
    assert cs.latest_id() is None


def test_corrupt_metadata_names_the_file(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store)
    cs.add(completed(1, {0: ["a"]}))
    store.put(cs.metadata_path(1), b"{not json")
    with pytest.raises(CorruptCheckpointError, match="chk-0000000001.json"):
        cs.load_latest()
    store.put(cs.latest_path, b"garbage")
    with pytest.raises(CorruptCheckpointError, match="LATEST"):
        cs.latest_id()
