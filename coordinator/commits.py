"""The coordinator as the driver of the sink's two-phase commit (phase two; Flink's
FileSink committer): pure bookkeeping for coordinator/state.py, no I/O, no clock.

The contract it keeps (dstltree.sparkplug.sinks.committer):

- A checkpoint's committables are committed only after its metadata is durable
  (``CheckpointWritten``), with :class:`CommitSink`; one commit at a time. A commit
  names the newest durable checkpoint not committed and carries the committables of
  it and of every older durable checkpoint not committed (committing is idempotent).
- A failed commit is retried ``commit_retry_interval`` seconds later, or at once when
  the next checkpoint becomes durable; it is never skipped: ``committed_through``
  only moves past a checkpoint once a commit that carried it succeeded.
- At an attempt's start the sink is recovered with :class:`RecoverSink`: the
  committables of every retained checkpoint, oldest first, then those of durable
  checkpoints not committed; then every other staged file is deleted. Until it is
  answered no commit starts (and the state triggers no checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterable

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.events import CommitSink, RecoverSink
from dstltree.sparkplug.sinks.layout import Committable


class SinkCommits:
    """Which durable checkpoints are committed. ``retry_interval``: seconds after a
    failed commit before the next try. Counters (``commits_completed``,
    ``commits_failed``, ``files_committed``, ``recoveries``) are public."""

    def __init__(self, retry_interval: float) -> None:
        self.retry_interval = retry_interval
        self.pending: list[CompletedCheckpoint] = []  # durable, not committed, oldest first
        self.in_flight: int | None = None  # checkpoint id of the outstanding CommitSink
        self.recovering: int | None = None  # newest checkpoint id the RecoverSink covers
        self.due = 0.0
        self.committed_through = 0  # every durable checkpoint up to this id is committed
        self.commits_completed = 0
        self.commits_failed = 0
        self.files_committed = 0
        self.recoveries = 0

    def durable(self, *cps: CompletedCheckpoint) -> list[CommitSink]:
        """``cps`` (oldest first) are written: their commit (with older ones) if none
        runs."""
        self.pending.extend(cps)
        return self.next_commit()

    def next_commit(self) -> list[CommitSink]:
        """A commit of every pending checkpoint, unless one runs or the sink recovers.
        Committables of checkpoints up to ``committed_through`` are left out: a task
        carries a committable in every acknowledgement until it hears of a commit that
        covered it, so the first durable checkpoint at or after its own carried it, and
        that one's commit succeeded (a task that acknowledged before hearing carries it
        once more; committing it again would only cost requests)."""
        if self.in_flight is not None or self.recovering is not None or not self.pending:
            return []
        self.in_flight = self.pending[-1].checkpoint_id
        fresh = [c for c in _committables(self.pending) if c.checkpoint_id > self.committed_through]
        return [CommitSink(self.in_flight, tuple(fresh))]

    def retry(self, now: float) -> list[CommitSink]:
        """The retry of a failed commit, once ``retry_interval`` has passed."""
        return [] if now < self.due else self.next_commit()

    def committed(self, checkpoint_id: int, files: int) -> list[CompletedCheckpoint]:
        """The commit of ``checkpoint_id`` succeeded; returns the checkpoints it
        committed, oldest first."""
        self.in_flight = None
        self.commits_completed += 1
        self.files_committed += files
        return self._through(checkpoint_id)

    def failed(self, now: float) -> None:
        """The outstanding commit failed: retried ``retry_interval`` seconds later."""
        self.in_flight = None
        self.commits_failed += 1
        self.due = now + self.retry_interval

    def recover(self, retained: Iterable[CompletedCheckpoint]) -> RecoverSink:
        """The recovery at an attempt's start (see the module docstring)."""
        cps = {c.checkpoint_id: c for c in retained}
        cps.update({c.checkpoint_id: c for c in self.pending})
        order = sorted(cps)
        self.recovering = order[-1] if order else 0
        commits = tuple(CommitSink(i, tuple(cps[i].committables())) for i in order)
        return RecoverSink(commits, _committables(cps.values()))

    def recovered(self, files: int) -> list[CompletedCheckpoint]:
        """The recovery succeeded; returns the pending checkpoints it committed."""
        through = self.recovering or 0
        self.recovering = None
        if self.in_flight is not None and self.in_flight <= through:
            self.in_flight = None  # covered by the recovery; its late answer is ignored
        self.recoveries += 1
        self.files_committed += files
        return self._through(through)

    def _through(self, checkpoint_id: int) -> list[CompletedCheckpoint]:
        done = [c for c in self.pending if c.checkpoint_id <= checkpoint_id]
        self.pending = [c for c in self.pending if c.checkpoint_id > checkpoint_id]
        self.committed_through = max(self.committed_through, checkpoint_id)
        return done


def _committables(cps: Iterable[CompletedCheckpoint]) -> tuple[Committable, ...]:
    """The committables of ``cps``, one per final name, in final-name (commit) order."""
    out = {c.final: c for cp in cps for c in cp.committables()}
    return tuple(out[k] for k in sorted(out))
