"""The completed-checkpoint store on DFS: metadata first, LATEST pointer last."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.errors import CorruptCheckpointError
from dstltree.coordinator.store import CheckpointStore, JobFencedError
from dstltree.coordinator.testing import completed
from dstltree.storage.store import ObjectStore
from tests.support.fencing import fence_two_stores


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


# -- fencing: one driver per job ---------------------------------------------------------


def _pointers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if "LATEST" in p.name)


def test_a_second_driver_fences_the_first(tmp_path: Path) -> None:
    fence_two_stores(
        CheckpointStore(ObjectStore(str(tmp_path))), CheckpointStore(ObjectStore(str(tmp_path)))
    )
    assert len(_pointers(tmp_path)) == 2  # old pointer versions are deleted


def test_a_stale_driver_is_fenced_even_after_its_next_version_was_deleted(
    tmp_path: Path,
) -> None:
    old, new = (
        CheckpointStore(ObjectStore(str(tmp_path))),
        CheckpointStore(ObjectStore(str(tmp_path))),
    )
    old.add(completed(1, {0: ["a"]}))  # claims version 1, writes version 2
    new.claim()
    for i in range(2, 6):
        new.add(completed(i, {0: [f"x{i}"]}))
    assert old.version == 2 and not (tmp_path / "checkpoints" / "LATEST-0000000003").exists()
    # Version 3 is free again, but a listing after the create shows newer ones.
    with pytest.raises(JobFencedError, match="newer"):
        old.add(completed(6, {0: ["y"]}))
    assert new.latest_id() == 5 and new.retained_ids() == [1, 2, 3, 4, 5]


def test_a_retried_create_of_our_own_pointer_is_no_fencing(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store, owner="driver-a")
    cs.claim()
    # The create landed but its answer was lost: the retry finds our own bytes.
    store.put(cs.pointer_path(2), cs._body(1, [1]))
    cs.add(completed(1, {0: ["a"]}))
    assert cs.version == 2 and cs.fenced is None
    # Another driver's bytes in the same version are fencing.
    store.put(cs.pointer_path(3), CheckpointStore(store, owner="driver-b")._body(2, [1, 2]))
    with pytest.raises(JobFencedError):
        cs.add(completed(2, {0: ["b"]}))


def test_the_old_single_latest_file_is_read_and_replaced(tmp_path: Path) -> None:
    import json

    store = ObjectStore(str(tmp_path))
    cp = completed(4, {0: ["a"]})
    store.put(store.join("checkpoints", "chk-0000000004.json"), json.dumps(cp.to_dict()).encode())
    store.put(store.join("checkpoints", "LATEST"), b'{"latest": 4, "retained": [4]}')
    cs = CheckpointStore(store)
    assert cs.load_latest() == cp and cs.latest_path.endswith("/LATEST")
    assert cs.claim() == 1
    cs.add(completed(5, {0: ["b"]}))
    assert cs.retained_ids() == [4, 5]
    assert _pointers(tmp_path) == ["LATEST-0000000001", "LATEST-0000000002"]


def test_an_empty_job_pointer_and_deleting_the_last_checkpoint(tmp_path: Path) -> None:
    cs = CheckpointStore(ObjectStore(str(tmp_path)))
    assert cs.claim() == 1 and cs.latest_id() is None and cs.retained_ids() == []
    cs.add(completed(1, {0: ["a"]}))
    cs.delete(1)
    assert cs.latest_id() is None and cs.stale_files() == []
    assert cs.claim() == 4  # a restarted driver continues the versions


def test_stale_files_younger_than_the_cutoff_are_spared(tmp_path: Path) -> None:
    import os
    import time

    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store)
    cs.add(completed(1, {0: ["a"]}))
    old, young = cs.metadata_path(5), cs.pointer_path(9) + ".tmp-1234"  # a claim under way
    store.put(old, b"{}")
    store.put(young, b"{}")
    t = time.time() - 120
    os.utime(old, (t, t))
    assert cs.stale_files(cutoff=time.time() - 60) == [old]
    assert sorted(cs.stale_files()) == sorted([old, young])
