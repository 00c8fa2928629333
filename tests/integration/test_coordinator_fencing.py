"""One driver per job and zero orphans, through the coordinator service: a second
coordinator on the same job prefix fences the first (locally and on moto S3); orphans
are swept during the run and at its end."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dstltree.coordinator import Coordinator, TaskLink, TriggerCheckpoint
from dstltree.coordinator.cleanup import list_data_files, scan_orphans, within_job
from dstltree.coordinator.store import CheckpointStore, JobFencedError
from dstltree.coordinator.testing import task_checkpoint
from dstltree.storage.store import ObjectExistsError, ObjectStore
from tests.support.fencing import fence_two_stores
from tests.support.s3_server import S3Target
from tests.support.waiting import wait_until


def _ack_next(link: TaskLink, paths: list[str], timeout: float = 30.0) -> TriggerCheckpoint:
    """Acknowledge the next TriggerCheckpoint on ``link`` with state naming ``paths``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for cmd in link.poll(timeout=0.05):
            if isinstance(cmd, TriggerCheckpoint):
                tc = task_checkpoint(link.task, link.attempt, paths)
                link.ack_checkpoint(cmd.checkpoint_id, tc)
                return cmd
    raise AssertionError("no checkpoint triggered")


def _checkpoint(coord: Coordinator, link: TaskLink, paths: list[str]) -> int:
    """Acknowledge triggers until one more checkpoint completed; returns its id."""
    done = coord.statistics().checkpoints_completed
    deadline = time.monotonic() + 10
    while coord.statistics().checkpoints_completed == done:
        assert time.monotonic() < deadline, "no checkpoint completed"
        _ack_next(link, paths)
        wait_until(
            lambda: (
                coord.statistics().checkpoints_completed > done
                or coord.statistics().checkpoints_aborted > 0
            ),
            timeout=5,
        )
    latest = coord.latest_checkpoint()
    assert latest is not None
    return latest.checkpoint_id


def test_a_second_coordinator_fences_the_first(tmp_path: Path) -> None:
    base = str(tmp_path / "job")
    store = ObjectStore(base)
    obj = store.new_object_path()
    store.put(obj, b"x")
    first = Coordinator(store, 1, checkpoint_interval=0.01)
    first.start()
    try:
        first.begin_attempt(0)
        with TaskLink(first.address, 0, 0) as link:
            assert _checkpoint(first, link, [obj]) == 1
            second = Coordinator(ObjectStore(base), 1, checkpoint_interval=0.01)
            second.start()  # claims the job: the first is fenced at its next write
            try:
                restored = second.begin_attempt(1)
                assert restored is not None and restored.checkpoint_id == 1

                # The first's next checkpoint fails at its pointer (or earlier, when
                # the second's cleanup removed its temporary file: then the next one).
                def fenced_after_an_ack() -> bool:
                    if first.statistics().writes_fenced > 0:
                        return True
                    _ack_next(link, [obj])
                    return False

                wait_until(fenced_after_an_ack, timeout=10)
                with pytest.raises(JobFencedError, match="fenced"):
                    first.latest_checkpoint()
                with pytest.raises(JobFencedError):
                    first.begin_attempt(7)
                assert first.statistics().fenced is not None
                with TaskLink(second.address, 0, 1) as link2:
                    latest = _checkpoint(second, link2, [obj])
                assert second.statistics().writes_fenced == 0
            finally:
                second.stop()
    finally:
        first.stop()
    last = CheckpointStore(store).latest_id()
    assert last is not None and last >= latest >= 2
    assert os.path.exists(obj)


def test_orphans_are_swept_during_the_run_and_at_its_end(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "job"))
    coord = Coordinator(
        store,
        1,
        checkpoint_interval=0.01,
        orphan_grace=30.0,
        sweep_interval=0,
        max_concurrent_checkpoints=1,  # this test acknowledges one trigger at a time
    )
    coord.start()
    kept = store.new_object_path()
    store.put(kept, b"x")
    old = store.new_object_path()  # a duplicate copy written long ago
    store.put(old, b"x")
    t = time.time() - 120
    os.utime(old, (t, t))
    young = store.new_snapshot_path()  # e.g. an abandoned materialization's snapshot
    store.put(young, b"x")
    try:
        coord.begin_attempt(0)
        with TaskLink(coord.address, 0, 0) as link:
            _checkpoint(coord, link, [kept])
            wait_until(lambda: not os.path.exists(old))  # swept during the run
            assert os.path.exists(young) and os.path.exists(kept)  # within the grace
            wait_until(lambda: coord.statistics().orphan_sweeps >= 1)  # counted after
            coord.request_stop()
            while coord.finished is None:
                _ack_next(link, [kept])
                coord.wait_finished(1.0)
            # The final sweep needs no grace: the run is over.
            wait_until(lambda: not os.path.exists(young))
    finally:
        coord.stop()
    assert list_data_files(store) == [kept]
    s = coord.statistics()
    assert s.orphans_deleted == 2 and s.deletes_refused == 0


# -- moto S3 -----------------------------------------------------------------------------


def test_conditional_create_and_fencing_on_s3(s3: S3Target) -> None:
    base = f"{s3.base_url}/jobs/job"
    store = ObjectStore(base, s3.storage_options)
    url = store.join("checkpoints", "x")
    store.put(url, b"1", exclusive=True)
    with pytest.raises(ObjectExistsError):
        store.put(url, b"2", exclusive=True)
    infos = store.list_info(store.join("checkpoints"))
    assert [i.url for i in infos] == [url] and infos[0].mtime is not None
    assert abs(infos[0].mtime - time.time()) < 60
    store.delete([url])
    # Orphan scans age files by S3's LastModified and never leave the job's prefix.
    obj = store.new_object_path()
    store.put(obj, b"x")
    other = ObjectStore(f"{s3.base_url}/jobs/job2", s3.storage_options)
    other.put(other.new_object_path(), b"x")
    assert scan_orphans(store, [], cutoff=time.time() - 60).spared == (obj,)
    assert scan_orphans(store, [], cutoff=time.time() + 60).orphans == (obj,)
    assert within_job(store, obj) and not within_job(store, other.new_object_path())
    store.delete([obj])
    fence_two_stores(CheckpointStore(store), CheckpointStore(ObjectStore(base, s3.storage_options)))


def test_two_coordinators_on_one_s3_job(s3: S3Target) -> None:
    base = f"{s3.base_url}/jobs/job"
    first = Coordinator(ObjectStore(base, s3.storage_options), 1)
    second = Coordinator(ObjectStore(base, s3.storage_options), 1)
    first.start()
    try:
        second.start()
        second.stop()
        with pytest.raises(JobFencedError):
            first.checkpoints.verify_owner()
        with pytest.raises(JobFencedError):
            first.latest_checkpoint()
    finally:
        first.stop()
