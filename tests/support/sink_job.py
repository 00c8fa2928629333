"""A model of a keyed job driving a FileSink the way the runtime and the coordinator
will (sparkplug/sinks/committer.py, "contract"): a source of numbered rows spread over
tasks, barriers that stage output, checkpoints that complete (committing their
committables and those of earlier checkpoints that did not complete), commits the
driver defers (a crash before commit), and failures that restore the latest completed
checkpoint in a new attempt, which re-emits the rows after that checkpoint's offset.

``visible()`` is what readers see; the tests compare it with ``expected()``, the rows
before the offset of the last committed checkpoint, each exactly once."""

from __future__ import annotations

from dataclasses import dataclass, field

from dstltree.sparkplug.sinks import Committable, FileSink, SinkWriter, read_committed


@dataclass
class _Checkpoint:
    checkpoint_id: int
    offset: int  # rows [0, offset) are before this checkpoint's cut
    committables: list[Committable]


@dataclass
class SinkJobModel:
    sink: FileSink
    tasks: int = 2
    attempt: int = 0
    next_row: int = 0
    next_checkpoint: int = 1
    pending: list[_Checkpoint] = field(default_factory=list)
    completed: list[_Checkpoint] = field(default_factory=list)
    uncommitted: list[Committable] = field(default_factory=list)
    committed_offset: int = 0
    writers: dict[int, SinkWriter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.writers = {t: self.sink.create_writer(t, self.attempt) for t in range(self.tasks)}

    def emit(self, n: int) -> None:
        for _ in range(n):
            row = self.next_row
            self.writers[row % self.tasks].write({"id": row, "attempt": self.attempt})
            self.next_row += 1

    def barrier(self) -> None:
        cid = self.next_checkpoint
        self.next_checkpoint += 1
        staged = [self.writers[t].prepare_commit(cid) for t in range(self.tasks)]
        self.pending.append(_Checkpoint(cid, self.next_row, [c for c in staged if c]))

    def complete(self, index: int, commit: bool) -> None:
        """Pending checkpoint ``index`` completes; the ones before it did not (declined)
        but their rows lie before its cut, so its metadata carries their committables
        too and they are committed with it."""
        if not self.pending:
            return
        index %= len(self.pending)
        done, self.pending = self.pending[: index + 1], self.pending[index + 1 :]
        carried = [c for cp in done for c in cp.committables]
        self.completed.append(_Checkpoint(done[-1].checkpoint_id, done[-1].offset, carried))
        self.uncommitted += carried
        if commit:
            self.sink.create_committer().commit(self.uncommitted)
            self.uncommitted = []
            self.committed_offset = done[-1].offset

    def fail(self) -> None:
        """Every task dies (no close: in-progress files stay), the driver restarts:
        re-commit the retained checkpoints, drop the rest, restore the latest."""
        for w in self.writers.values():
            w._io.shutdown(wait=True)  # the crash: stop the thread, keep its files
        committer = self.sink.create_committer()
        retained = [c for cp in self.completed for c in cp.committables]
        committer.commit(retained)
        committer.abort([c for cp in self.pending for c in cp.committables])
        committer.cleanup(retained)
        latest = self.completed[-1] if self.completed else _Checkpoint(0, 0, [])
        self.committed_offset = latest.offset
        self.attempt += 1
        self.next_row, self.next_checkpoint = latest.offset, latest.checkpoint_id + 1
        self.pending, self.uncommitted = [], []
        self.writers = {t: self.sink.create_writer(t, self.attempt) for t in range(self.tasks)}

    def finish(self) -> None:
        self.barrier()
        self.complete(-1, commit=True)
        for w in self.writers.values():
            w.close()

    def visible(self) -> list[int]:
        table = read_committed(self.sink.url, self.sink.format, self.sink.storage_options)
        return sorted(table.column("id").to_pylist()) if table.num_rows else []

    def expected(self) -> list[int]:
        return list(range(self.committed_offset))
