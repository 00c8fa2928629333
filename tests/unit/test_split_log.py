"""Checkpoint metadata that does not grow with the input: the readers' split states
folded into the enumerator snapshot, finished split ids compacted into split logs
(coordinator/splitlog.py) that checkpoints reference like snapshots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import CompletedCheckpoint, TaskCheckpoint
from dstltree.coordinator.errors import CorruptCheckpointError
from dstltree.coordinator.events import (
    AttemptStarted,
    CheckpointWritten,
    DeleteObjects,
    ListSplits,
    PersistCheckpoint,
    SplitLogFailed,
    SplitLogWritten,
    SplitsListed,
    Started,
    Tick,
    WriteSplitLog,
)
from dstltree.coordinator.splitlog import COMPACT_AFTER, decode_split_log, encode_split_log
from dstltree.coordinator.state import CoordinatorConfig, CoordinatorState
from dstltree.coordinator.store import CheckpointStore
from dstltree.sparkplug.sources import MemorySource, Split, SplitState
from dstltree.storage.store import ObjectStore
from tests.support.coordinator_events import feed, hello, message, of_type

CFG = CoordinatorConfig(
    checkpoint_interval=1.0,
    materialization_interval=1000.0,
    checkpoint_timeout=50.0,
    retained_checkpoints=2,
    discovery_interval=0.0,
    object_prefixes=("o/",),
)


class _Job:
    """One task reading ``n`` one-record splits that land ``per_checkpoint`` at a time
    (as the demo's files do): at each checkpoint the new ones are listed and assigned
    and the reader has finished every split assigned before; split logs are written
    at once (as ``o/log-<k>.splits``)."""

    def __init__(self, n: int, per_checkpoint: int = 10) -> None:
        self.ids = [f"part-{i:05d}-{'x' * 40}.parquet" for i in range(n)]
        self.src = MemorySource({}, finished=False)
        self.s = CoordinatorState(CFG, source=self.src, validate=True)
        feed(self.s, Started(0.0), AttemptStarted(0.0, 0, 1), hello(0.0, 0, 0))
        self.per, self.landed = per_checkpoint, 0
        self.assigned: list[str] = []
        self.now, self.logs = 0.0, 0
        self.sizes: list[int] = []
        self.written: list[CompletedCheckpoint] = []
        self.answer_logs = True

    def _land(self) -> None:
        """The next files land and are listed (then assigned to the one reader)."""
        new = self.ids[self.landed : self.landed + self.per]
        for i in new:
            self.src.add_split(i, [{"v": 1}])
        self.landed += len(new)
        if self.landed == len(self.ids) and not self.src.finished:
            self.src.finish()
        # one tick: the checkpoint's trigger (its snapshot), then the listing's answer
        for ls in of_type(feed(self.s, Tick(self.now, wall=1000.0 + self.now)), ListSplits):
            feed(self.s, SplitsListed(self.now, ls.enumerator.list_splits()))  # type: ignore[attr-defined]
        self.assigned += new

    def checkpoint(self) -> list:
        done = list(self.assigned)  # finished before this barrier
        self.now += 1.0
        self._land()
        cid = self.s.in_flight()[-1]
        states = tuple(SplitState(Split(i), 1, True) for i in done)
        tc = TaskCheckpoint(0, 0, splits=states)
        (persist,) = of_type(
            feed(self.s, message(self.now, 0, 0, protocol.Ack(0, 0, cid, tc))), PersistCheckpoint
        )
        cp = persist.checkpoint  # type: ignore[attr-defined]
        self.sizes.append(len(json.dumps(cp.to_dict(), separators=(",", ":"))))
        self.written.append(cp)
        out = feed(self.s, CheckpointWritten(self.now, cid))
        for ins in of_type(out, WriteSplitLog) if self.answer_logs else ():
            self.logs += 1
            path = f"o/log-{self.logs}.splits"
            feed(self.s, SplitLogWritten(self.now, path, ins.ids))  # type: ignore[attr-defined]
        return out


def test_readers_states_are_folded_and_finished_ids_compacted() -> None:
    job = _Job(100)
    job.checkpoint()  # nothing finished at the first barrier
    out = job.checkpoint()  # 10 finished: below COMPACT_AFTER
    cp2 = job.written[-1]
    assert all(tc.splits == () for tc in cp2.tasks.values())
    assert cp2.enumerator is not None and len(cp2.enumerator.finished) == 10
    assert not of_type(out, WriteSplitLog) and COMPACT_AFTER > 10
    for _ in range(3):
        job.checkpoint()  # 40 finished at checkpoint 5: a split log of those 40
    assert job.logs == 1
    job.checkpoint()
    cp5 = job.written[-1]
    assert cp5.finished_log is not None and cp5.finished_log.path == "o/log-1.splits"
    assert cp5.finished_log.count == 40 and "o/log-1.splits" in cp5.referenced_paths()
    d = cp5.to_dict()
    assert len(d["enumerator"]["finished"]) == 10  # only those finished since
    # Read back (the store reads the log): the whole set again.
    back = CompletedCheckpoint.from_dict(d)
    assert back.enumerator is not None and len(back.enumerator.finished) == 10
    full = back.resolved(frozenset(job.ids[:40]))
    assert full.enumerator == cp5.enumerator
    with pytest.raises(ValueError, match="holds 39 ids"):
        back.resolved(frozenset(job.ids[:39]))
    # The registry counts the log like a snapshot; it goes with its last checkpoint.
    assert job.s.registry.counts()["o/log-1.splits"] == 1
    deleted: list[str] = []
    for _ in range(8):
        deleted += [p for d in of_type(job.checkpoint(), DeleteObjects) for p in d.paths]  # type: ignore[attr-defined]
    assert "o/log-1.splits" in deleted and job.logs >= 2
    assert len(job.written) == 14 and job.written[-1].enumerator is not None


def test_metadata_does_not_grow_with_the_input() -> None:
    small, large = _Job(40), _Job(400)
    for job in (small, large):
        for _ in range(len(job.ids) // job.per + 2):
            job.checkpoint()
        assert job.written[-1].enumerator is not None
        assert len(job.written[-1].enumerator.finished) == len(job.ids)
    assert max(large.sizes) <= max(small.sizes) + 512
    assert large.sizes[-1] <= 4 * large.sizes[0]
    # Without compaction every finished id would be in every checkpoint.
    assert max(large.sizes) * 5 < 400 * len(large.ids[0])


def test_a_failed_split_log_write_is_asked_again_and_the_sweep_spares_it() -> None:
    job = _Job(100, per_checkpoint=40)
    job.answer_logs = False
    s = job.s
    job.checkpoint()
    (ask,) = of_type(job.checkpoint(), WriteSplitLog)  # 40 finished, asked at wall 1002
    # Until it is answered, the sweeps spare files younger than the request.
    scope = s.sweep_scope()
    assert scope is not None and scope[1] is not None and scope[1] <= 1002.0
    assert not of_type(job.checkpoint(), WriteSplitLog)  # one at a time
    feed(s, SplitLogFailed(job.now, "StorageError: injected"))
    (again,) = of_type(job.checkpoint(), WriteSplitLog)
    assert len(again.ids) == 100  # type: ignore[attr-defined]
    feed(s, SplitLogWritten(job.now, "o/log-9.splits", again.ids))  # type: ignore[attr-defined]
    scope = s.sweep_scope()
    assert scope is not None and "o/log-9.splits" in scope[0]
    job.checkpoint()
    assert job.written[-1].finished_log is not None


def test_split_log_file_format_and_corruption(tmp_path: Path) -> None:
    raw = encode_split_log(["b", "a", "a"])
    assert decode_split_log("p", raw, 2) == {"a", "b"}
    with pytest.raises(CorruptCheckpointError, match="p.*holds 2 ids, not 3"):
        decode_split_log("p", raw, 3)
    bad_version = json.dumps({"format": "dstl-split-log", "version": 9, "finished": []})
    with pytest.raises(CorruptCheckpointError, match="version 9"):
        decode_split_log("p", bad_version.encode())
    for hostile in (b"[1]", b'{"format": "dstl-split-log", "version": 1, "finished": [1]}'):
        with pytest.raises(CorruptCheckpointError):
            decode_split_log("p", hostile)


def test_the_store_reads_the_split_log_of_a_checkpoint(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path))
    job = _Job(100, per_checkpoint=40)
    for _ in range(3):
        job.checkpoint()
    cp = job.written[-1]
    assert cp.finished_log is not None
    path = store.join("materialized", "ab", "log.splits")
    ids = cp.finished_log.ids
    assert ids is not None
    store.put(path, encode_split_log(ids))
    from dataclasses import replace

    cp = replace(cp, finished_log=replace(cp.finished_log, path=path))
    cs = CheckpointStore(store)
    cs.add(cp)
    assert CheckpointStore(store).load_latest() == cp
    assert CheckpointStore(store).load_latest().enumerator == cp.enumerator  # type: ignore[union-attr]
    store.put(path, b"garbage")
    with pytest.raises(CorruptCheckpointError, match="log.splits"):
        CheckpointStore(store).load_latest()


def test_a_backlog_of_unstarted_splits_costs_no_metadata() -> None:
    """All files there at the start (a backlog of 400): the splits no reader started
    are left out of the metadata (Source.relists) and listed again on restore."""
    ids = [f"part-{i:05d}-{'x' * 40}.parquet" for i in range(400)]
    src = MemorySource({i: [{"v": 1}, {"v": 2}] for i in ids}, finished=True)
    s = CoordinatorState(CFG, source=src, validate=True)
    out = feed(s, Started(0.0), AttemptStarted(0.0, 0, 1), Tick(0.0))
    (ls,) = of_type(out, ListSplits)
    feed(s, SplitsListed(0.0, ls.enumerator.list_splits()))  # type: ignore[attr-defined]
    feed(s, hello(0.0, 0, 0), Tick(1.0))
    states = (SplitState(Split(ids[0]), 2, True), SplitState(Split(ids[1]), 1))
    tc = TaskCheckpoint(0, 0, splits=states)
    (persist,) = feed(s, message(1.0, 0, 0, protocol.Ack(0, 0, 1, tc)))
    cp = persist.checkpoint  # type: ignore[attr-defined]
    assert cp.enumerator.pending == (states[1],) and not cp.enumerator.complete
    assert len(json.dumps(cp.to_dict())) < 2048
    # Restored: the enumerator lists again and finds the other 398 at offset 0.
    again = CoordinatorState(CFG, [cp], source=src, validate=True)
    out = feed(again, Started(2.0), AttemptStarted(2.0, 1, 1), Tick(2.0))
    (ls,) = of_type(out, ListSplits)
    feed(again, SplitsListed(2.0, ls.enumerator.list_splits()))  # type: ignore[attr-defined]
    snap = again.splits.snapshot() if again.splits is not None else None
    assert snap is not None and snap.complete and snap.finished == {ids[0]}
    assert {s.split.id: s.offset for s in snap.pending} == {
        ids[1]: 1,
        **{i: 0 for i in ids[2:]},
    }
