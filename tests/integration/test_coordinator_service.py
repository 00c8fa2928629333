"""The ZeroMQ coordinator and task links over loopback, with real changelog writers,
and with a source and an exactly-once FileSink: tasks read assigned splits, stage at
barriers, and the run ends with a final checkpoint whose output is committed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import zmq

from dstltree.client import ChangelogClient
from dstltree.client.errors import StorageError
from dstltree.coordinator import (
    ApplyMaterialization,
    AssignSplits,
    CheckpointComplete,
    CompletedCheckpoint,
    Coordinator,
    ErrorReply,
    Fenced,
    Finish,
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
from dstltree.sparkplug.sinks import (
    Committable,
    FileSink,
    SinkCommitError,
    SinkWriter,
    committed_files,
    read_committed,
)
from dstltree.sparkplug.sinks.layout import STAGING_DIR
from dstltree.sparkplug.sources import MemorySource, Source, SplitReader, SplitState
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
    # Grace 0: a persist of a checkpoint that was still pending at the stop wrote a file
    # seconds ago, which the default grace (60 s) rightly spares.
    late = store.new_object_path()  # such a file, every time
    store.put(late, b"late")
    again = Coordinator(store, NUM_TASKS, orphan_grace=0.0)
    again.start()
    try:
        assert again.begin_attempt(1) == latest
        referenced = set().union(*(c.referenced_paths() for c in retained))
        assert set(list_data_files(store)) == referenced
        assert late not in referenced
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
    coord = Coordinator(store, 2, orphan_grace=0)
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
    """Puts of commit records of checkpoints (not the claim) wait for ``gate``;
    ``entered`` is set when one starts waiting. ``fail`` makes them raise instead."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail = False

    def put(self, url: str, parts: Sequence[Any] | Any, **kw: Any) -> int:
        if f"/{CHECKPOINT_DIR}/commit-" in url and b'"kind":"checkpoint"' in bytes(parts):
            if self.fail:
                raise StorageError("put", url, "injected failure")
            self.entered.set()
            assert self.gate.wait(30), "gate never opened"
        return super().put(url, parts, **kw)


def _ack_next(link: TaskLink, store: ObjectStore, timeout: float = 5.0) -> int:
    """Wait for the next TriggerCheckpoint on ``link`` and acknowledge it (one object of
    ``store``); returns its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for cmd in link.poll(timeout=0.05):
            if isinstance(cmd, TriggerCheckpoint):
                tc = task_checkpoint(link.task, link.attempt, [store.new_object_path()])
                link.ack_checkpoint(cmd.checkpoint_id, tc)
                return cmd.checkpoint_id
    raise AssertionError("no checkpoint triggered")


def _request(sock: zmq.Socket, frame: bytes) -> protocol.Message:  # type: ignore[type-arg]
    sock.send(frame)
    assert sock.poll(5000), "no reply"
    return protocol.load(sock.recv())


def test_slow_metadata_write_does_not_stop_the_loop(tmp_path: Path) -> None:
    store = GatedStore(str(tmp_path))
    coord = Coordinator(
        store, 1, checkpoint_interval=0.01, checkpoint_timeout=60.0, max_concurrent_checkpoints=1
    )
    coord.start()
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(coord.address)
    try:
        coord.begin_attempt(1)
        with TaskLink(coord.address, 0, 1) as link:
            assert _ack_next(link, store) == 1
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
            assert _ack_next(link, store) == 2  # the next one follows the write
    finally:
        store.gate.set()
        raw.close()
        coord.stop()
    assert CheckpointStore(store).latest_id() in (1, 2)


def test_checkpoints_overlap_and_complete_in_order_in_one_record(tmp_path: Path) -> None:
    store = GatedStore(str(tmp_path))
    coord = Coordinator(store, 1, checkpoint_interval=0.01, max_concurrent_checkpoints=3)
    coord.start()
    try:
        coord.begin_attempt(0)
        with TaskLink(coord.address, 0, 0) as link:
            assert _ack_next(link, store) == 1
            wait_until(store.entered.is_set)  # the record of checkpoint 1 is being written
            # Triggers follow the interval meanwhile, up to three in flight.
            assert [_ack_next(link, store) for _ in range(2)] == [2, 3]
            assert link.poll(timeout=0.2) == []  # the bound
            assert coord.statistics().checkpoints_completed == 0
            store.gate.set()
            wait_until(lambda: coord.statistics().checkpoints_completed == 3)
            s = coord.statistics()
            # Pipelined: one record per checkpoint, created at once (record 10 carries
            # 1 as well, record 11 carries 1 and 2), confirmed in order; one request
            # each on its path.
            assert s.completion_requests == (1, 1, 1)
            assert s.checkpoints_in_flight_max == 3 and s.max_concurrent_checkpoints == 3
            assert len(s.checkpoint_intervals_s) >= 2
            # 1 is subsumed (retention 2): record 9, which held only 1, goes, off the
            # completion path; the claim (record 1) and records 10 and 11 stay.
            records = tmp_path / "checkpoints"
            wait_until(
                lambda: (
                    sorted(p.name[7:17] for p in records.glob("commit-*"))
                    == ["0000000001", "0000000010", "0000000011"]
                )
            )
    finally:
        store.gate.set()
        coord.stop()
    cs = CheckpointStore(store)
    assert cs.retained_ids()[-2:] == [2, 3] and cs.head().seq == 11


def test_failed_metadata_write_aborts_and_the_next_checkpoint_completes(tmp_path: Path) -> None:
    store = GatedStore(str(tmp_path))
    store.gate.set()
    store.fail = True
    coord = Coordinator(store, 1, checkpoint_interval=0.01)
    coord.start()
    try:
        coord.begin_attempt(0)
        with TaskLink(coord.address, 0, 0) as link:
            assert _ack_next(link, store) == 1
            wait_until(lambda: coord.statistics().checkpoints_aborted == 1)
            store.fail = False
            assert _ack_next(link, store) == 2
            wait_until(lambda: coord.statistics().checkpoints_completed == 1)
    finally:
        coord.stop()
    assert CheckpointStore(store).retained_ids() == [2]
    assert coord.statistics().last_checkpoint_id == 2


# -- a source, a sink, the end of a run ----------------------------------------------


@dataclass
class _Reader:
    """What one task's source reader holds: unfinished assigned splits (head first,
    at their current offsets), finished ones, the open iterator of the head."""

    reader: SplitReader
    queue: list[SplitState] = field(default_factory=list)
    done: list[SplitState] = field(default_factory=list)
    current: Iterator[dict[str, Any]] | None = None

    def step(self, link: TaskLink, writer: SinkWriter, n: int) -> None:
        """Read up to ``n`` records into ``writer``; report finished splits."""
        while n > 0 and self.queue:
            head = self.queue[0]
            if self.current is None:
                self.current = self.reader.read(head.split, head.offset)
            record = next(self.current, None)
            if record is None:
                self.done.append(replace(head, finished=True))
                self.queue.pop(0)
                self.current = None
                link.splits_finished((head.split.id,))
                continue
            writer.write(record)
            self.queue[0] = replace(head, offset=head.offset + 1)
            n -= 1


def _run_task(address: str, source: Source, sink: FileSink, task: int, box: dict[str, Any]) -> None:
    """A task of attempt 0: reads its assigned splits into its sink writer, stages at
    every barrier and carries its committables until CheckpointComplete, reads nothing
    after a final barrier, returns on Finish (``box["finish", task]``)."""
    try:
        link = TaskLink(address, task, 0)
        writer = sink.create_writer(task, 0)
        r = _Reader(source.create_reader())
        carried: list[Committable] = []
        final = False
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for cmd in link.poll(timeout=0.005):
                if isinstance(cmd, AssignSplits):
                    r.queue += cmd.states
                elif isinstance(cmd, TriggerCheckpoint):
                    staged = writer.prepare_commit(cmd.checkpoint_id)
                    carried += [staged] if staged is not None else []
                    splits = (*r.done, *r.queue)
                    tc = TaskCheckpoint(task, 0, splits=splits, committables=tuple(carried))
                    link.ack_checkpoint(cmd.checkpoint_id, tc)
                    final = final or cmd.final
                elif isinstance(cmd, CheckpointComplete):
                    carried = [c for c in carried if c.checkpoint_id > cmd.checkpoint_id]
                elif isinstance(cmd, Finish):
                    box["finish", task] = cmd.checkpoint_id
                    writer.close()
                    link.close()
                    return
            if not final:
                r.step(link, writer, 2)
        raise AssertionError(f"task {task} was not told to finish")
    except BaseException as e:  # noqa: BLE001 - reported to the test thread
        box.setdefault("errors", []).append(e)


def _staged(sink: FileSink) -> list[str]:
    store = sink.store()
    return store.list_files(store.join(STAGING_DIR))


def _run(
    tmp_path: Path, source: MemorySource, until: Callable[[Coordinator], None]
) -> tuple[Coordinator, FileSink, CompletedCheckpoint, dict[str, Any]]:
    """Two tasks over ``source`` into a json FileSink until the run is finished;
    ``until(coord)`` runs while they work."""
    sink = FileSink(str(tmp_path / "out"), format="json")
    coord = Coordinator(
        ObjectStore(str(tmp_path / "cp")),
        2,
        checkpoint_interval=0.05,
        source=source,
        sink=sink,
        discovery_interval=0.02,
    )
    coord.start()
    box: dict[str, Any] = {}
    try:
        assert coord.begin_attempt(0) is None
        threads = [
            threading.Thread(target=_run_task, args=(coord.address, source, sink, t, box))
            for t in range(2)
        ]
        for th in threads:
            th.start()
        until(coord)
        cp = coord.wait_finished(20)
        for th in threads:
            th.join(20)
    finally:
        coord.stop()
    assert not box.get("errors"), box.get("errors")
    assert cp is not None and cp.final and coord.finished == cp
    assert box["finish", 0] == box["finish", 1] == cp.checkpoint_id
    return coord, sink, cp, box


def test_run_to_the_end_of_the_source_commits_every_record_once(tmp_path: Path) -> None:
    splits = {f"s{i}": [{"id": f"s{i}-{n}"} for n in range(7)] for i in range(5)}
    coord, sink, cp, _ = _run(tmp_path, MemorySource(splits), lambda c: None)
    rows = read_committed(sink.url, "json").column("id").to_pylist()
    assert sorted(rows) == sorted(r["id"] for rs in splits.values() for r in rs)
    assert _staged(sink) == []  # everything staged was committed
    assert cp.enumerator is not None and cp.enumerator.finished == set(splits)
    assert (cp.parallelism, cp.max_parallelism) == (2, 128)
    assert CheckpointStore(ObjectStore(str(tmp_path / "cp"))).load_latest() == cp
    s = coord.statistics()
    assert s.finished_checkpoint_id == cp.checkpoint_id and s.splits_discovered == 5
    assert s.sink_files_committed == len(committed_files(sink.url)) >= 2


def test_a_stop_request_ends_the_run_with_a_final_checkpoint(tmp_path: Path) -> None:
    splits = {f"s{i}": [{"id": f"s{i}-{n}"} for n in range(500)] for i in range(4)}
    source = MemorySource(splits, finished=False)  # never finishes by itself

    def stop_after_a_checkpoint(coord: Coordinator) -> None:
        wait_until(lambda: coord.statistics().checkpoints_completed >= 2)
        coord.request_stop()

    _, sink, cp, _ = _run(tmp_path, source, stop_after_a_checkpoint)
    rows = read_committed(sink.url, "json").column("id").to_pylist()
    assert cp.enumerator is not None  # the readers' offsets at the final barrier, folded in
    read = {s.split.id: s.offset for s in cp.enumerator.pending}
    read.update({sid: len(splits[sid]) for sid in cp.enumerator.finished})
    assert sorted(rows) == sorted(f"{sid}-{n}" for sid, o in read.items() for n in range(o))
    assert _staged(sink) == []


def test_begin_attempt_recovers_the_sink(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "out"), format="json")
    w0 = sink.create_writer(0, 0)
    staged = []
    for cid, row in enumerate(["a", "b", "c"], 1):
        w0.write({"id": row})
        staged.append(w0.prepare_commit(cid))
    w0.close()
    c1, c2, c3 = staged  # c3: an aborted checkpoint's
    assert c1 is not None and c2 is not None and c3 is not None
    with sink.create_writer(0, 1) as w1:  # a failed attempt's staged file
        w1.write({"id": "z"})
        assert w1.prepare_commit(9) is not None
    sink.create_committer().commit([c1])  # committed before the driver crashed
    store = ObjectStore(str(tmp_path / "cp"))
    for cid, c in [(1, c1), (2, c2)]:
        tc = TaskCheckpoint(0, 0, committables=(c,))
        CheckpointStore(store).add(CompletedCheckpoint(cid, 0, 0, 0.0, 0.0, {0: tc}, 1, 128))
    coord = Coordinator(store, 1, sink=sink)
    coord.start()
    try:
        latest = coord.begin_attempt(2)
        assert latest is not None and latest.checkpoint_id == 2
        assert read_committed(sink.url, "json").column("id").to_pylist() == ["a", "b"]
        assert _staged(sink) == []  # c3 and the failed attempt's file are gone
        assert coord.statistics().sink_files_committed == 1  # c1 was committed before
    finally:
        coord.stop()


def test_begin_attempt_raises_when_the_sink_cannot_be_recovered(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "out"), format="json")
    with sink.create_writer(0, 0) as w:
        w.write({"id": "a"})
        c1 = w.prepare_commit(1)
    assert c1 is not None
    sink.store().delete([sink.store().join(c1.staged)])  # staged output lost
    store = ObjectStore(str(tmp_path / "cp"))
    tc = TaskCheckpoint(0, 0, committables=(c1,))
    CheckpointStore(store).add(CompletedCheckpoint(1, 0, 0, 0.0, 0.0, {0: tc}, 1, 128))
    coord = Coordinator(store, 1, sink=sink, checkpoint_interval=0.01)
    coord.start()
    try:
        with pytest.raises(SinkCommitError, match="lost"):
            coord.begin_attempt(0)
        with TaskLink(coord.address, 0, 0) as link:  # the attempt triggers nothing
            assert link.poll(timeout=0.2) == []
    finally:
        coord.stop()
