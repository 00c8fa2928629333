"""Orphan cleanup: confined to the job's prefix, sparing young files; the in-run and
final sweeps and what the coordinator state lets them delete."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import MaterializedRef
from dstltree.coordinator.cleanup import job_prefixes, normalize, scan_orphans, within_job
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointWritten,
    CleanOrphans,
    DeleteFailed,
    DeleteObjects,
    ObjectsDeleted,
    OrphansDeleted,
    PersistCheckpoint,
    Started,
    StopRequested,
    SweepOrphans,
    Tick,
)
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.coordinator.storage_worker import StorageWorker
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.sweep import OrphanSweeper, SweepPolicy
from dstltree.coordinator.testing import completed, task_checkpoint
from dstltree.storage.store import ObjectStore
from tests.support.coordinator_events import feed, hello, message, of_type


def _put(store: ObjectStore, url: str, age_s: float = 0.0) -> str:
    store.put(url, b"x")
    if age_s:
        t = time.time() - age_s
        os.utime(url, (t, t))
    return url


def test_only_the_jobs_own_folders_are_in_scope(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "job"))
    base = str(tmp_path / "job")
    assert job_prefixes(store) == tuple(
        f"{base}/{d}/" for d in ("changelog", "materialized", "checkpoints")
    )
    assert within_job(store, f"{base}/changelog/ab/x.dstl")
    assert within_job(store, f"file://{base}/materialized/x.snap")
    assert not within_job(store, f"{base}/changelog/../../job2/changelog/x.dstl")
    assert not within_job(store, f"{tmp_path}/job2/changelog/x.dstl")  # a sibling job
    assert not within_job(store, f"{base}/changelog")  # the folder itself
    assert not within_job(store, f"{base}/other/x")
    assert within_job(store, "/elsewhere/x", extra=["/elsewhere"])
    assert normalize(store, f"{base}/./changelog//a/../b") == f"{base}/changelog/b"


def test_scan_spares_referenced_young_and_other_jobs_files(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "job"))
    other = ObjectStore(str(tmp_path / "job2"))
    old = _put(store, store.new_object_path(), age_s=120)
    young = _put(store, store.new_snapshot_path())
    kept = _put(store, store.new_object_path(), age_s=120)
    foreign = _put(other, other.new_object_path(), age_s=120)
    scan = scan_orphans(store, [kept], cutoff=time.time() - 60)
    assert scan.orphans == (old,) and scan.spared == (young,)
    assert sorted(scan_orphans(store, [kept]).orphans) == sorted([old, young])
    assert os.path.exists(foreign)


def test_worker_refuses_deletions_outside_the_job_and_counts_them(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "job"))
    worker = StorageWorker(store, CheckpointStore(store), orphan_grace=60.0)
    try:
        inside = _put(store, store.new_object_path())
        outside = _put(store, str(tmp_path / "job2" / "changelog" / "x.dstl"))
        escape = f"{tmp_path}/job/changelog/../../job2/changelog/x.dstl"
        event = worker.call(DeleteObjects((inside, outside, escape)))
        assert isinstance(event, ObjectsDeleted) and event.deleted == 1
        assert os.path.exists(outside) and not os.path.exists(inside)
        assert worker.counters.snapshot()["deletes_refused"] == 2
        # The cleanup at start spares what is younger than the grace period.
        old = _put(store, store.new_object_path(), age_s=120)
        young = _put(store, store.new_object_path())
        event = worker.call(CleanOrphans(frozenset()))
        assert isinstance(event, OrphansDeleted) and event.orphans == 1
        assert not os.path.exists(old) and os.path.exists(young)
        assert worker.counters.snapshot()["orphans_spared"] == 1
    finally:
        worker.shutdown()


def test_a_fenced_worker_deletes_nothing(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    first, second = CheckpointStore(store), CheckpointStore(ObjectStore(str(tmp_path)))
    first.claim()
    worker = StorageWorker(store, first, orphan_grace=0.0)
    try:
        orphan = _put(store, store.new_object_path(), age_s=120)
        second.claim()  # another driver takes the job over
        event = worker.call(SweepOrphans(frozenset(), None, final=True))
        assert isinstance(event, DeleteFailed) and "fenced" in event.reason
        assert os.path.exists(orphan)
        event = worker.call(DeleteObjects((orphan,)))
        assert isinstance(event, ObjectsDeleted) and event.deleted == 0
        c = worker.counters.snapshot()
        assert c["writes_fenced"] == 1 and c["deletes_refused"] == 1
    finally:
        worker.shutdown()


# -- what the state lets a sweep delete --------------------------------------------------

CFG = CoordinatorConfig(1.0, 1000.0, 5.0, 2, object_prefixes=("o/",))


def _ack(now: float, cid: int, paths: list[str]) -> object:
    tc = task_checkpoint(0, 0, paths)
    return message(now, 0, 0, protocol.Ack(0, 0, cid, tc))


def test_sweep_scope_follows_the_latest_trigger_and_ends_with_the_run() -> None:
    s = CoordinatorState(CFG, [completed(1, {0: ["o/old"]})], validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 1), hello(0.0, 0, 0))
    s.handle(Tick(0.5, 1000.5))
    restored = s.sweep_scope()  # the restored checkpoint's trigger (epoch 0 in tests)
    assert restored is not None and restored[0] == {"o/old"} and restored[1] == 0.0
    feed(s, Tick(1.0, 1001.0))  # triggers checkpoint 2 at wall 1001
    out = s.handle(_ack(1.5, 2, ["o/a"]))  # type: ignore[arg-type]
    assert of_type(out, PersistCheckpoint)
    scope = s.sweep_scope()
    assert scope is not None and scope[0] == {"o/old", "o/a"}  # being written: still spared
    feed(s, CheckpointWritten(2.0, 2), Tick(3.0, 1003.0))  # triggers checkpoint 3
    s.handle(_ack(3.5, 3, ["o/a", "o/b"]))  # type: ignore[arg-type]
    scope = s.sweep_scope()
    assert scope is not None
    assert scope[0] == {"o/old", "o/a", "o/b"}  # the pending acknowledgement's paths too
    assert 1000.0 <= scope[1] <= 1001.0  # checkpoint 2's trigger (wall clock)
    feed(s, CheckpointWritten(4.0, 3), StopRequested(4.0))  # the final checkpoint 4
    s.handle(_ack(4.5, 4, ["o/a", "o/b"]))  # type: ignore[arg-type]
    feed(s, CheckpointWritten(5.0, 4))
    assert s.finished is not None
    assert s.sweep_scope() == (frozenset({"o/a", "o/b"}), None)  # the end: any age


def test_sweeper_sweeps_every_interval_and_once_at_the_end() -> None:
    s = CoordinatorState(CFG, validate=True)
    sweeper = OrphanSweeper(SweepPolicy(interval=10.0, grace=30.0), wall=lambda: 5000.0)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 1), hello(0.0, 0, 0))
    assert sweeper.next(s, 0.0) is None  # no checkpoint yet
    feed(s, Tick(1.0, 1001.0))
    s.handle(_ack(1.5, 1, ["o/a"]))  # type: ignore[arg-type]
    feed(s, CheckpointWritten(2.0, 1))
    first = sweeper.next(s, 2.0)
    assert first is not None and not first.final and first.cutoff is not None
    assert first.cutoff <= 1001.0 - 30.0 and first.referenced == {"o/a"}
    assert sweeper.next(s, 5.0) is None  # not due yet
    assert sweeper.next(s, 12.5) is not None
    assert sweeper.next(s, 30.0, final_only=True) is None
    feed(s, StopRequested(31.0))
    s.handle(_ack(31.5, 2, ["o/b"]))  # type: ignore[arg-type]
    feed(s, CheckpointWritten(32.0, 2))
    final = sweeper.next(s, 32.0, final_only=True)
    assert final is not None and final.final and final.cutoff is None
    assert sweeper.next(s, 100.0) is None  # the final sweep is issued once in the run
    # and once more when the coordinator stops (what tasks wrote after it), then never
    closing = sweeper.next(s, 101.0, final_only=True)
    assert closing is not None and closing.final and closing.cutoff is None
    assert sweeper.next(s, 102.0, final_only=True) is None


def test_the_final_sweep_spares_no_report_of_an_epoch_left_pending() -> None:
    s = CoordinatorState(CFG, validate=True)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 1), hello(0.0, 0, 0))
    feed(s, Tick(1.0, 1001.0))
    s.handle(_ack(1.5, 1, ["o/a"]))  # type: ignore[arg-type]
    feed(
        s,
        CheckpointWritten(2.0, 1),
        Tick(CFG.materialization_interval + 1.0, 1001.0 + CFG.materialization_interval),
    )
    epoch = s.next_epoch - 1
    ref = MaterializedRef("o/snap", 5, 10)  # beyond what the task acknowledged: waits
    feed(s, message(CFG.materialization_interval + 1.1, 0, 0, protocol.Report(0, 0, epoch, ref)))
    scope = s.sweep_scope()
    assert scope is not None and "o/snap" in scope[0]  # reported: spared during the run
    feed(s, StopRequested(200.0))
    for now in (201.0, 202.0, 203.0):  # the checkpoint in flight, then the final one
        if s.finished is None and s.in_flight():
            cid = s.in_flight()[-1]
            s.handle(_ack(now, cid, ["o/a"]))  # type: ignore[arg-type]
            feed(s, CheckpointWritten(now + 0.1, cid), Tick(now + 0.2, 1100.0 + now))
    assert s.finished is not None
    assert s.sweep_scope() == (frozenset({"o/a"}), None)  # the epoch is never applied


def test_a_wall_clock_stepped_forward_pauses_in_run_sweeps_until_the_end() -> None:
    """The driver's wall clock jumps an hour ahead after checkpoint 2: the next
    checkpoint's trigger (wall clock) would put the cutoff an hour ahead of the store's
    clock, and files a task wrote after it, not acknowledged yet, would look old. No
    in-run sweep is issued from the jump on; the final one (no clock) still is."""
    s = CoordinatorState(CFG, validate=True)
    sweeper = OrphanSweeper(SweepPolicy(interval=0.0, grace=30.0), wall=lambda: 1002.0)
    feed(s, Started(0.0), AttemptStarted(0.0, 0, 1), hello(0.0, 0, 0), Tick(1.0, 1001.0))
    s.handle(_ack(1.5, 1, ["o/a"]))  # type: ignore[arg-type]
    feed(s, CheckpointWritten(2.0, 1))
    assert sweeper.next(s, 2.0) is not None  # before the jump: sweeps as usual
    feed(s, Tick(3.0, 1003.0 + 3600.0))  # stepped forward: triggers checkpoint 2
    s.handle(_ack(3.5, 2, ["o/a"]))  # type: ignore[arg-type]
    feed(s, CheckpointWritten(4.0, 2))
    assert s.clock.jumped and s.clock.moved_s == 3600.0
    assert s.sweep_scope() is None and sweeper.next(s, 4.0) is None
    feed(s, StopRequested(5.0))
    s.handle(_ack(5.5, 3, ["o/a"]))  # type: ignore[arg-type]
    feed(s, CheckpointWritten(6.0, 3))
    final = sweeper.next(s, 6.0, final_only=True)
    assert final is not None and final.final and final.cutoff is None


def test_a_clock_that_moves_by_less_than_the_jump_threshold_is_no_jump() -> None:
    from dstltree.coordinator.wallclock import JUMP_S, WallClock

    c = WallClock()
    c.observe(0.0, 1000.0)
    c.observe(100.0, 1100.0 + JUMP_S / 2)  # slewed
    assert not c.jumped and c.moved_s == JUMP_S / 2
    c.observe(200.0, 1200.0 - JUMP_S - 1)  # stepped back
    assert c.jumped and c.moved_s == -(JUMP_S + 1)
    c.validate()
