"""The ZeroMQ coordinator and task links over loopback, with real changelog writers."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq

from dstltree.client import ChangelogClient
from dstltree.client.errors import StorageError
from dstltree.coordinator import (
    ApplyMaterialization,
    CheckpointComplete,
    Coordinator,
    ErrorReply,
    Fenced,
    Materialize,
    MaterializedRef,
    TaskCheckpoint,
    TaskLink,
    TriggerCheckpoint,
    protocol,
)
from dstltree.coordinator.cleanup import list_data_files
from dstltree.coordinator.store import CheckpointStore
from dstltree.coordinator.testing import completed, task_checkpoint
from dstltree.storage.store import CHECKPOINT_DIR, ObjectStore
from tests.support.waiting import wait_until

NUM_TASKS = 3
KG_PER_TASK = 4


def _task(address: str, base: str, task: int, stop: threading.Event, errors: list) -> None:
    """A stateful task: record i is appended as change b"i"; a snapshot holds the
    number of records before its SQN."""
    try:
        client = ChangelogClient.open(base)
        kgs = range(task * KG_PER_TASK, (task + 1) * KG_PER_TASK)
        writer = client.create_writer(f"task-{task}", kgs)
        link = TaskLink(address, task, 0)
        offset = 0
        materialized: MaterializedRef | None = None
        after = writer.next_sqn()
        while not stop.is_set():
            writer.append(kgs[offset % KG_PER_TASK], str(offset).encode())
            offset += 1
            for cmd in link.poll(timeout=0.002):
                if isinstance(cmd, TriggerCheckpoint):
                    h = writer.persist_durably(after).result(timeout=10)
                    tc = TaskCheckpoint(task, 0, offset, materialized, (h,))
                    link.ack_checkpoint(cmd.checkpoint_id, tc)
                elif isinstance(cmd, Materialize):
                    sqn = writer.next_sqn()
                    path = client.store.new_snapshot_path()
                    size = client.store.put(path, str(offset).encode())
                    link.report_materialization(cmd.epoch, MaterializedRef(path, sqn, size))
                elif isinstance(cmd, ApplyMaterialization):
                    materialized = cmd.ref
                    writer.truncate(cmd.ref.sqn)
                    after = cmd.ref.sqn
                elif not isinstance(cmd, CheckpointComplete):
                    raise AssertionError(f"unexpected {cmd}")
        link.close()
        client.close()
    except BaseException as e:  # noqa: BLE001 - reported to the test thread
        errors.append(e)


def test_end_to_end_checkpoints_materialization_and_deletion(tmp_path: Path) -> None:
    base = str(tmp_path)
    store = ObjectStore(base)
    coord = Coordinator(
        store,
        NUM_TASKS,
        checkpoint_interval=0.05,
        materialization_interval=0.3,
        checkpoint_timeout=5.0,
    )
    coord.start()
    assert coord.begin_attempt(0) is None
    stop = threading.Event()
    errors: list = []
    threads = [
        threading.Thread(target=_task, args=(coord.address, base, t, stop, errors))
        for t in range(NUM_TASKS)
    ]
    for th in threads:
        th.start()
    try:

        def done() -> bool:
            s = coord.statistics()
            latest = coord.latest_checkpoint()
            return (
                bool(errors)
                or s.materializations_completed >= 1
                and s.checkpoints_completed >= 6
                and s.objects_deleted > 0
                and latest is not None
                and all(t.materialized is not None for t in latest.tasks.values())
            )

        wait_until(done)
    finally:
        stop.set()
        for th in threads:
            th.join(10)
        coord.stop()
    assert not errors, errors
    stats = coord.statistics()
    assert len(stats.checkpoint_durations_s) == stats.checkpoints_completed
    assert stats.retained_checkpoint_ids == (stats.last_checkpoint_id - 1, stats.last_checkpoint_id)
    # Registry-driven deletion kept every object a retained checkpoint references.
    retained = CheckpointStore(store).list_retained()
    assert [c.checkpoint_id for c in retained] == list(stats.retained_checkpoint_ids)
    present = set(list_data_files(store))
    for cp in retained:
        assert cp.referenced_paths() <= present
    # Restore: snapshot + changelog replay gives exactly the records before the offset.
    latest = retained[-1]
    reader = ChangelogClient.open(base)
    for t, tc in latest.tasks.items():
        assert tc.materialized is not None
        n = int(store.read(tc.materialized.path))
        replayed = sorted(int(c) for h in tc.changelog for _sqn, _kg, c in reader.iter_changes(h))
        assert replayed == list(range(n, tc.records)), t
        # Truncation: no handle reaches below the snapshot's SQN.
        assert all(h.sqn_range[0] >= tc.materialized.sqn for h in tc.changelog)
    reader.close()
    # A restarted coordinator recovers the same latest checkpoint and cleans orphans.
    again = Coordinator(store, NUM_TASKS)
    again.start()
    try:
        assert again.begin_attempt(1) == latest
        referenced = set().union(*(c.referenced_paths() for c in retained))
        assert set(list_data_files(store)) == referenced
    finally:
        again.stop()


def test_orphans_and_stale_metadata_deleted_on_start(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    keep = [store.new_object_path(), store.new_snapshot_path()]
    orphans = [store.new_object_path(), store.new_snapshot_path(), keep[0] + ".tmp-1234"]
    for p in keep + orphans:
        store.put(p, b"x")
    cs = CheckpointStore(store)
    cs.add(completed(1, {0: [keep[0]], 1: [keep[1]]}))
    store.put(cs.metadata_path(2), b"{}")  # written but never committed
    coord = Coordinator(store, 2)
    coord.start()
    try:
        s = coord.statistics()
        assert s.orphans_deleted == 3 and s.stale_metadata_deleted == 1
        assert list_data_files(store) == sorted(keep)
        assert coord.latest_checkpoint() == cs.load_latest()
    finally:
        coord.stop()


def test_malformed_messages_get_an_error_and_fencing_over_the_wire(tmp_path: Path) -> None:
    coord = Coordinator(ObjectStore(str(tmp_path)), 1, checkpoint_interval=0.02)
    coord.start()
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(coord.address)
    try:
        coord.begin_attempt(0)
        for bad in (b"\xc1garbage", protocol.dump(protocol.Materialize(1))):
            raw.send(bad)
            assert raw.poll(5000), "no reply"
            assert isinstance(protocol.load(raw.recv()), ErrorReply)
        raw.send_multipart([b"a", b"b"])
        assert raw.poll(5000) and isinstance(protocol.load(raw.recv()), ErrorReply)
        # The coordinator keeps serving: a task connects and gets a checkpoint.
        with TaskLink(coord.address, 0, 0) as link:
            cmds = link.poll(timeout=5.0)
            assert cmds and isinstance(cmds[0], TriggerCheckpoint)
            coord.begin_attempt(1)
            link.report_materialization(1, MaterializedRef("s", 1, 1))
            deadline = time.monotonic() + 5
            got: list = []
            while not link.fenced and time.monotonic() < deadline:
                got += link.poll(timeout=0.05)
            assert link.fenced and Fenced(0) in got
        assert coord.statistics().messages_rejected == 3
        assert coord.statistics().messages_fenced >= 1
    finally:
        raw.close()
        coord.stop()


class GatedStore(ObjectStore):
    """Puts of checkpoint metadata (not the ``LATEST`` pointer) wait for ``gate``;
    ``entered`` is set when one starts waiting. ``fail`` makes them raise instead."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail = False

    def put(self, url: str, parts: Sequence[Any] | Any, **kw: Any) -> int:
        if f"/{CHECKPOINT_DIR}/chk-" in url:
            if self.fail:
                raise StorageError("put", url, "injected failure")
            self.entered.set()
            assert self.gate.wait(30), "gate never opened"
        return super().put(url, parts, **kw)


def _ack_next(link: TaskLink, timeout: float = 5.0) -> int:
    """Wait for the next TriggerCheckpoint on ``link`` and acknowledge it; returns its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for cmd in link.poll(timeout=0.05):
            if isinstance(cmd, TriggerCheckpoint):
                tc = task_checkpoint(link.task, link.attempt, [f"obj-{cmd.checkpoint_id}"])
                link.ack_checkpoint(cmd.checkpoint_id, tc)
                return cmd.checkpoint_id
    raise AssertionError("no checkpoint triggered")


def _request(sock: zmq.Socket, frame: bytes) -> protocol.Message:  # type: ignore[type-arg]
    sock.send(frame)
    assert sock.poll(5000), "no reply"
    return protocol.load(sock.recv())


def test_slow_metadata_write_does_not_stop_the_loop(tmp_path: Path) -> None:
    store = GatedStore(str(tmp_path))
    coord = Coordinator(store, 1, checkpoint_interval=0.01, checkpoint_timeout=60.0)
    coord.start()
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(coord.address)
    try:
        coord.begin_attempt(1)
        with TaskLink(coord.address, 0, 1) as link:
            assert _ack_next(link) == 1
            wait_until(store.entered.is_set)  # the worker is stuck writing checkpoint 1
            # Meanwhile the loop answers: a bad message, a stale attempt, the driver.
            assert isinstance(_request(raw, b"\xc1"), ErrorReply)
            stale = _request(raw, protocol.dump(protocol.Hello(0, 0)))
            assert stale == Fenced(0)
            s = coord.statistics()
            assert (s.messages_rejected, s.messages_fenced, s.checkpoints_completed) == (1, 1, 0)
            assert coord.latest_checkpoint() is None
            assert link.poll(timeout=0.1) == []  # no second checkpoint while one is written
            store.gate.set()
            wait_until(lambda: coord.statistics().checkpoints_completed == 1)
            latest = coord.latest_checkpoint()
            assert latest is not None and latest.checkpoint_id == 1
            assert _ack_next(link) == 2  # the next one follows the write
    finally:
        store.gate.set()
        raw.close()
        coord.stop()
    assert CheckpointStore(store).latest_id() in (1, 2)


def test_failed_metadata_write_aborts_and_the_next_checkpoint_completes(tmp_path: Path) -> None:
    store = GatedStore(str(tmp_path))
    store.gate.set()
    store.fail = True
    coord = Coordinator(store, 1, checkpoint_interval=0.01)
    coord.start()
    try:
        coord.begin_attempt(0)
        with TaskLink(coord.address, 0, 0) as link:
            assert _ack_next(link) == 1
            wait_until(lambda: coord.statistics().checkpoints_aborted == 1)
            store.fail = False
            assert _ack_next(link) == 2
            wait_until(lambda: coord.statistics().checkpoints_completed == 1)
    finally:
        coord.stop()
    assert CheckpointStore(store).retained_ids() == [2]
    assert coord.statistics().last_checkpoint_id == 2
