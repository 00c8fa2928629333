"""Objects of nodes shared by several jobs (nodes by host, writing under their own
topology's prefix): a job's registry deletes such an object once released only when
every segment in it is of the job's own logs; an object with another job's segment, or
an unreadable index, is kept and counted."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from dstltree.client.objectformat import build_object
from dstltree.client.segment import SegmentMeta
from dstltree.coordinator.events import (
    DeleteObjects,
    ObjectsDeleted,
    OrphansDeleted,
    Started,
    SweepOrphans,
)
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.coordinator.storage_worker import StorageWorker
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.testing import completed
from dstltree.storage.store import ObjectStore


def _object(store: ObjectStore, logs: list[str]) -> str:
    """A real object (segments, index, footer) with one segment per log in ``logs``."""
    data = [bytes([65 + i]) * (100 + i) for i in range(len(logs))]
    metas = [SegmentMeta(log, 0, 1, (0,), len(d), 0) for log, d in zip(logs, data, strict=True)]
    parts, _ = build_object(list(zip(metas, data, strict=True)))
    url = store.new_object_path()
    store.put(url, parts)
    return url


def test_a_shared_object_is_deleted_only_when_all_its_segments_are_the_jobs(
    tmp_path: Path,
) -> None:
    job, shared = ObjectStore(str(tmp_path / "job")), ObjectStore(str(tmp_path / "nodes"))
    worker = StorageWorker(job, CheckpointStore(job), extra_prefixes=[shared.join("changelog")])
    try:
        mine = _object(shared, ["job-t0-a0", "job-t1-a0"])
        mixed = _object(shared, ["job-t0-a0", "other-t0-a0"])
        broken = shared.new_object_path()
        shared.put(broken, b"not an object")
        own = _object(job, ["whoever"])  # the job's own folder: no index read
        logs = frozenset({"job-t0-a0", "job-t1-a0"})
        event = worker.call(DeleteObjects((mine, mixed, broken, own), logs))
        assert isinstance(event, ObjectsDeleted) and event.deleted == 2
        assert not os.path.exists(mine) and not os.path.exists(own)
        assert os.path.exists(mixed), "another job's segment is in it"
        assert os.path.exists(broken), "its index cannot be read: kept"
        counts = worker.counters.snapshot()
        assert counts["shared_objects_kept"] == 2 and counts["deletes_refused"] == 0
    finally:
        worker.shutdown()


def test_the_release_names_the_logs_of_the_job() -> None:
    cfg = CoordinatorConfig(1.0, 1000.0, 5.0, 1, object_prefixes=("o/",))
    old = completed(1, {0: ["o/a"], 1: ["o/b"]})
    new = completed(2, {0: ["o/c"], 1: ["o/b"]})
    state = CoordinatorState(cfg, [old, new])  # retention 1: the start releases old
    deletes = [i for i in state.handle(Started(0.0)) if isinstance(i, DeleteObjects)]
    assert [d.paths for d in deletes] == [("o/a",)]
    assert deletes[0].logs == frozenset({"log-0", "log-1"})  # coordinator.testing's logs


def test_kept_shared_objects_are_counted_in_statistics_and_metrics(tmp_path: Path) -> None:
    from dstltree.coordinator import Coordinator

    job, shared = ObjectStore(str(tmp_path / "job")), ObjectStore(str(tmp_path / "nodes"))
    coord = Coordinator(job, 1, metrics_port=0, extra_object_prefixes=[shared.join("changelog")])
    try:
        mixed = _object(shared, ["job-t0-a0", "other-t0-a0"])
        coord._storage.call(DeleteObjects((mixed,), frozenset({"job-t0-a0"})))
        assert os.path.exists(mixed)
        assert coord.statistics().shared_objects_kept == 1
        assert coord.metrics is not None
        sample = coord.metrics.registry.get_sample_value("dstl_shared_objects_kept_total")
        assert sample == 1.0
    finally:
        coord.stop()


def _aged(store: ObjectStore, url: str, age_s: float) -> str:
    t = time.time() - age_s
    os.utime(store._path(url), (t, t))
    return url


def test_sweeps_delete_only_this_runs_orphans_under_the_shared_prefix(tmp_path: Path) -> None:
    job, shared = ObjectStore(str(tmp_path / "job")), ObjectStore(str(tmp_path / "nodes"))
    worker = StorageWorker(
        job,
        CheckpointStore(job),
        extra_prefixes=[shared.join("changelog")],
        log_namespace="run1",
    )
    try:
        ours = _aged(shared, _object(shared, ["run1-t0-a0", "run1-t1-a1"]), 120)
        young = _object(shared, ["run1-t0-a0"])
        named = _aged(shared, _object(shared, ["run1-t0-a0"]), 120)  # referenced
        mixed = _aged(shared, _object(shared, ["run1-t0-a0", "run2-t0-a0"]), 120)
        theirs = _aged(shared, _object(shared, ["run10-t0-a0"]), 120)  # not "run1-"
        broken = shared.new_object_path()
        shared.put(broken, b"no index")
        _aged(shared, broken, 120)
        reserved = shared.new_object_path()  # a node's empty file, made ahead
        shared.put(reserved, b"")
        sweep = SweepOrphans(frozenset({named}), time.time() - 60, final=False)
        event = worker.call(sweep)
        assert isinstance(event, OrphansDeleted) and event.orphans == 1
        left = {u for u in (ours, young, named, mixed, theirs, broken) if shared.exists(u)}
        assert left == {young, named, mixed, theirs, broken}
        counts = worker.counters.snapshot()
        assert counts["shared_orphans_deleted"] == 1 and counts["orphans_spared"] == 1
        # the final sweep (any age) takes the young one too; the others stay
        event = worker.call(SweepOrphans(frozenset({named}), None, final=True))
        assert isinstance(event, OrphansDeleted) and event.orphans == 1
        assert not shared.exists(young) and shared.exists(mixed) and shared.exists(theirs)
        assert shared.exists(reserved) and worker.counters.snapshot()["orphans_spared"] == 0
        # a released object with a segment of this run not named by the release
        release = DeleteObjects((named,), frozenset({"run1-t9-a9"}))
        event = worker.call(release)
        assert isinstance(event, ObjectsDeleted) and event.deleted == 1
        assert not shared.exists(named)
    finally:
        worker.shutdown()


def test_a_restarted_driver_cleans_the_orphans_of_the_run_it_restores(tmp_path: Path) -> None:
    from dstltree.coordinator import Coordinator
    from dstltree.coordinator.testing import handle, task_checkpoint

    job, shared = ObjectStore(str(tmp_path / "job")), ObjectStore(str(tmp_path / "nodes"))
    named = _object(shared, ["run0-t0-a1"])
    tc = replace(task_checkpoint(0, 1), changelog=(handle("run0-t0-a1", [named]),))
    CheckpointStore(job).add(replace(completed(1, {}, attempt=1), tasks={0: tc}))
    left = _aged(shared, _object(shared, ["run0-t0-a1"]), 120)  # a persist never acked
    theirs = _aged(shared, _object(shared, ["elsewhere-t0-a0"]), 120)
    coord = Coordinator(
        job,
        1,
        extra_object_prefixes=[shared.join("changelog")],
        log_namespace="run1",  # the new driver's run
    )
    coord.start()  # the cleanup at start (grace 60 s)
    try:
        assert not shared.exists(left), "the restored run's orphan"
        assert shared.exists(named) and shared.exists(theirs)
        assert coord.statistics().shared_orphans_deleted == 1
    finally:
        coord.stop()
