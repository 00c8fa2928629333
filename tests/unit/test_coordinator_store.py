"""The completed-checkpoint store on DFS: one commit record per completion, claims that
fence, the old layout read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.cleanup import scan_orphans
from dstltree.coordinator.compact import pack
from dstltree.coordinator.errors import CorruptCheckpointError
from dstltree.coordinator.splitlog import encode_split_log
from dstltree.coordinator.store import (
    CLAIM_GAP as G,
)
from dstltree.coordinator.store import (
    MAX_RECORDS_IN_FLIGHT,
    CheckpointStore,
    JobFencedError,
)
from dstltree.coordinator.testing import completed
from dstltree.storage.errors import StorageError
from dstltree.storage.store import ObjectStore
from tests.support.fencing import fence_two_stores


def _files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "checkpoints").iterdir())


def test_round_trip_and_latest(tmp_path: Path) -> None:
    cs = CheckpointStore(ObjectStore(str(tmp_path)))
    assert cs.load_latest() is None and cs.list_retained() == []
    cp1 = completed(1, {0: ["a"], 1: ["b"]})
    path = cs.add(cp1)  # claims record 1, commits in record 1 + CLAIM_GAP
    assert path == cs.record_path(G + 1) and cs.seq == G + 1
    assert cs.load_latest() == cp1
    cp2 = completed(2, {0: ["a", "c"], 1: ["b"]})
    cs.add(cp2)
    assert [c.checkpoint_id for c in cs.list_retained()] == [1, 2]
    assert CompletedCheckpoint.from_dict(cp2.to_dict()) == cp2
    # Subsumption is committed with the record: 1 is no longer retained.
    cs.add(completed(3, {0: ["c"]}), retained=[2])
    assert cs.retained_ids() == [2, 3]
    assert cs.stale_files() == [cs.record_path(G + 1)]
    assert cs.delete(2) == []  # still retained: nothing deleted
    assert cs.delete(1) == [cs.record_path(G + 1)]
    assert cs.stale_files() == []
    assert _files(tmp_path) == [Path(cs.record_path(i)).name for i in (1, G + 2, G + 3)]
    # A new store instance (a restarted driver, a task) sees the same state.
    again = CheckpointStore(ObjectStore(str(tmp_path)))
    assert again.latest_id() == 3 and again.retained_ids() == [2, 3]
    assert again.load(2) == cp2


def test_one_request_on_the_completion_path_and_several_checkpoints_in_one_record(
    tmp_path: Path,
) -> None:
    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store)
    cs.claim()
    cps = [completed(i, {0: [f"o{i}"]}) for i in (1, 2, 3)]
    done = cs.commit(cps, retained=[2, 3])
    assert done.requests == 1 and done.seq == G + 1
    assert done.metadata_bytes[1] == 0 and done.metadata_bytes[3] > 0  # 1 is subsumed at once
    assert cs.retained_ids() == [2, 3] and cs.list_retained() == cps[1:]
    with pytest.raises(ValueError, match="newest"):
        cs.commit([completed(4, {0: ["x"]})], retained=[3])
    with pytest.raises(ValueError, match="not known"):
        cs.commit([completed(4, {0: ["x"]})], retained=[1, 4])


def test_a_crash_between_any_two_steps_loses_no_completed_checkpoint(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store)
    cs.add(completed(1, {0: ["a"]}))
    # Between the steps of completing 2: nothing written yet -> 1 is the latest.
    assert CheckpointStore(store).latest_id() == 1
    cs.add(completed(2, {0: ["b"]}), retained=[1])
    # After the commit point, before any cleanup: 2 is the latest; nothing is stale.
    assert CheckpointStore(store).latest_id() == 2 and cs.stale_files() == []
    cs.add(completed(3, {0: ["c"]}), retained=[2])
    # Crashed before deleting record 2 (1 subsumed): a later sweep removes it.
    survivor = CheckpointStore(store)
    assert survivor.retained_ids() == [2, 3]
    assert survivor.stale_files() == [cs.record_path(G + 1)]
    survivor.claim()
    assert survivor.stale_files() == [cs.record_path(G + 1)]
    assert [c.checkpoint_id for c in survivor.list_retained()] == [2, 3]
    # No temporary files are left behind by the atomic writes.
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if ".tmp" in p.name]
    # A split log or a released object whose deletion the crash interrupted, or one
    # written but never referenced: an orphan for the sweeps.
    log = store.join("materialized", "ab", "x.splits")
    store.put(log, encode_split_log(["f-1"]))
    assert scan_orphans(store, survivor.list_retained()[-1].referenced_paths()).orphans == (log,)


def test_corrupt_and_unknown_records_name_the_file_and_the_version(tmp_path: Path) -> None:
    import json

    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store)
    cs.add(completed(1, {0: ["a"]}))
    first, newer = G + 1, G + 2
    store.put(cs.record_path(newer), b"{not json")
    with pytest.raises(CorruptCheckpointError, match=f"commit-{newer:010d}.json"):
        cs.load_latest()
    body = json.loads(store.read(cs.record_path(first)))
    body.update(version=99, seq=newer)
    store.put(cs.record_path(newer), json.dumps(body).encode())
    with pytest.raises(CorruptCheckpointError, match=rf"commit-{newer:010d}.json.*version 99"):
        cs.latest_id()
    body.update(version=3, retained=[[1, 99]])
    store.put(cs.record_path(newer), json.dumps(body).encode())
    with pytest.raises(CorruptCheckpointError, match="ahead"):
        cs.latest_id()
    body.update(retained=[[1, first]], checkpoints=[{**completed(1, {}).to_dict(), "version": 7}])
    store.put(cs.record_path(first), json.dumps({**body, "seq": first}).encode())
    store.delete([cs.record_path(newer)])
    with pytest.raises(CorruptCheckpointError, match=rf"commit-{first:010d}.json.*version 7"):
        CheckpointStore(store).load_latest()


# -- fencing: one driver per job ---------------------------------------------------------


def test_a_second_driver_fences_the_first(tmp_path: Path) -> None:
    fence_two_stores(
        CheckpointStore(ObjectStore(str(tmp_path))), CheckpointStore(ObjectStore(str(tmp_path)))
    )


def test_a_stale_driver_is_fenced_even_after_its_records_were_deleted(tmp_path: Path) -> None:
    old, new = (
        CheckpointStore(ObjectStore(str(tmp_path))),
        CheckpointStore(ObjectStore(str(tmp_path))),
    )
    old.add(completed(1, {0: ["a"]}))  # claims record 1, commits record 1 + CLAIM_GAP
    new.claim()  # record 2 + CLAIM_GAP
    for i in range(2, 6):
        new.add(completed(i, {0: [f"x{i}"]}), retained=[i - 1])
        new.delete(i - 2) if i > 2 else None
    assert not os.path.exists(old.record_path(G + 1))
    # Record 3, the new driver's claim, is never deleted: the old one's next create
    # finds it there, with no listing.
    with pytest.raises(JobFencedError, match="exists"):
        old.add(completed(6, {0: ["y"]}))
    assert new.latest_id() == 5 and new.retained_ids() == [4, 5]


def test_a_retried_create_of_our_own_record_is_no_fencing(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store, owner="driver-a")
    cs.claim()
    seq = cs.reserve()
    cp = completed(1, {0: ["a"]})
    # An earlier create of ours landed although it was taken for failed: the same bytes.
    body = cs._body("checkpoint", seq, [(1, seq)], [1], [pack(cp.to_dict(), store.base_url)])
    store.put(cs.record_path(seq), body)
    done = cs.commit([cp], [1], seq)
    assert done.seq == seq and done.requests == 2 and cs.fenced is None
    assert cs.latest_id() == 1
    # Another driver's record at our next seq is fencing.
    other = CheckpointStore(store, owner="driver-b")
    nxt = cs.reserve()
    store.put(cs.record_path(nxt), other._body("claim", nxt, [(1, seq)], [1, nxt], []))
    with pytest.raises(JobFencedError):
        cs.commit([completed(2, {0: ["b"]})], [1, 2], nxt)


def test_pipelined_records_complete_out_of_order_and_stand_alone(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    cs = CheckpointStore(store)
    cs.claim()
    s1, s2 = cs.reserve(), cs.reserve()
    cp1, cp2 = completed(1, {0: ["a"]}), completed(2, {0: ["b"]})
    # The second record (carrying 1 too) lands first: it alone is a complete head.
    cs.commit([cp1, cp2], [1, 2], s2)
    assert CheckpointStore(store).list_retained() == [cp1, cp2]
    cs.commit([cp1], [1], s1)  # the first lands late: the head stays the newest record
    assert cs.seq == s2 and CheckpointStore(store).head().seq == s2
    # At most MAX_RECORDS_IN_FLIGHT beyond the newest created record: when failed
    # creates used them up, the store claims again (a new owner token), above them.
    burnt = [cs.reserve() for _ in range(MAX_RECORDS_IN_FLIGHT)]
    owner = cs.owner
    again = cs.reserve()
    assert cs.owner != owner and cs.head().claims[-1] == s2 + 1
    assert again == s2 + 1 + G and max(burnt) < again
    # a burnt create landing late is a stray of the old token: never the head
    cs2 = CheckpointStore(store, owner=owner)
    cs2._claims = (1,)
    store.put(cs.record_path(burnt[-1]), cs2._body("checkpoint", burnt[-1], [(1, s2)], [1], []))
    assert CheckpointStore(store).head().seq == s2 + 1


def test_a_fenced_driver_s_strays_are_skipped_and_never_collide(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    a, b = CheckpointStore(store, owner="a"), CheckpointStore(store, owner="b")
    a.add(completed(1, {0: ["a"]}))  # a: claim 1, record 1 + G
    s1, s2, s3 = a.reserve(), a.reserve(), a.reserve()
    claim = b.claim()  # nothing of a's in flight has landed: b claims at s1
    assert claim == s1
    cp2, cp3 = completed(2, {0: ["b"]}), completed(3, {0: ["c"]})
    # a's third record in flight (carrying 2) lands: a stray within the gap above the
    # claim; its first collides with the claim, so a confirms neither
    a.commit([cp2, cp3], [2, 3], s3)
    assert claim < s3 < claim + G
    with pytest.raises(JobFencedError):
        a.commit([cp2], [2], s1)
    reader = CheckpointStore(store)
    assert reader.head().seq == claim and reader.latest_id() == 1
    assert reader.stale_files() == [a.record_path(s3)]
    # b's records start above the gap: no stray can be there
    done = b.commit([cp2], [1, 2])
    assert done.seq == claim + G and reader.latest_id() == 2
    # a driver that did not see the collision yet finds b's claim above its own
    late = CheckpointStore(store, owner="a")
    late._claim, late._mine = a._claim, {s1, s2, s3}
    with pytest.raises(JobFencedError):
        late.verify_owner()


def test_the_layout_of_3002318_is_read_and_its_drivers_fenced(tmp_path: Path) -> None:
    import json

    store = ObjectStore(str(tmp_path))
    cp = completed(4, {0: ["a"]})
    store.put(store.join("checkpoints", "chk-0000000004.json"), json.dumps(cp.to_dict()).encode())
    store.put(store.join("checkpoints", "LATEST-0000000007"), b'{"latest": 4, "retained": [4]}')
    cs = CheckpointStore(store)
    assert cs.latest_id() == 4 and cs.load_latest() == cp
    assert cs.claim() == 1
    # The old layout's next pointer version fences a driver of 3002318 still running.
    assert (tmp_path / "checkpoints" / "LATEST-0000000008").exists()
    cs.add(completed(5, {0: ["b"]}))
    assert [c.checkpoint_id for c in cs.list_retained()] == [4, 5]
    assert cs.stale_files() == [cs.pointer_path(7)]
    cs.add(completed(6, {0: ["c"]}), retained=[5])
    assert cs.delete(4) == [cs.metadata_path(4)]


def test_the_old_single_latest_file_is_read(tmp_path: Path) -> None:
    import json

    store = ObjectStore(str(tmp_path))
    cp = completed(4, {0: ["a"]})
    store.put(store.join("checkpoints", "chk-0000000004.json"), json.dumps(cp.to_dict()).encode())
    store.put(store.join("checkpoints", "LATEST"), b'{"latest": 4, "retained": [4]}')
    cs = CheckpointStore(store)
    assert cs.latest_id() == 4 and cs.load_latest() == cp
    cs.add(completed(5, {0: ["b"]}))
    assert cs.retained_ids() == [4, 5]
    assert (tmp_path / "checkpoints" / "LATEST-0000000001").exists()


def test_an_empty_job(tmp_path: Path) -> None:
    cs = CheckpointStore(ObjectStore(str(tmp_path)))
    assert cs.latest_id() is None and cs.retained_ids() == [] and cs.stale_files() == []
    assert cs.claim() == 1 and cs.latest_id() is None
    with pytest.raises(StorageError, match="not retained"):
        cs.load(1)
