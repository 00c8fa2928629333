"""Events into and instructions out of the coordinator state machine (no I/O).

Every event carries ``now``: seconds on the shell's monotonic clock when it happened.
Protocol messages (coordinator/protocol.py) are wrapped, never mirrored: a task's
message arrives as :class:`MessageFromTask` holding the decoded message, and a command
to a task leaves as :class:`SendToTask` / :class:`Reply` holding the message to send.
Storage work runs off the event loop; each instruction reports back with one event:

- :class:`PersistCheckpoint` -> :class:`CheckpointWritten` | :class:`WriteFailed`;
- :class:`DeleteCheckpoint`, :class:`DeleteObjects`, :class:`CleanOrphans` ->
  :class:`CheckpointDeleted`, :class:`ObjectsDeleted`, :class:`OrphansDeleted` |
  :class:`DeleteFailed`;
- :class:`ListSplits` -> :class:`SplitsListed` | :class:`ListingFailed`;
- :class:`CommitSink` -> :class:`SinkCommitted` | :class:`CommitFailed`;
- :class:`RecoverSink` -> :class:`SinkRecovered` | :class:`SinkRecoveryFailed`.

The pattern is dask/distributed's ``worker_state_machine``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef
from dstltree.sparkplug.sinks.layout import Committable
from dstltree.sparkplug.sources.base import Listing, SplitEnumerator

# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passes. ``wall``: epoch seconds at ``now`` (recorded as ``created_at`` of the
    next completed checkpoint; None keeps the previous one)."""

    now: float
    wall: float | None = None


@dataclass(frozen=True)
class Started:
    """The service starts over the retained checkpoints the state was built with."""

    now: float


@dataclass(frozen=True)
class AttemptStarted:
    """Attempt ``attempt`` (strictly increasing) of ``num_tasks`` tasks begins."""

    now: float
    attempt: int
    num_tasks: int


@dataclass(frozen=True)
class MessageFromTask:
    """A decoded ``message`` from the peer with ROUTER identity ``identity``."""

    now: float
    identity: bytes
    message: protocol.Message


@dataclass(frozen=True)
class MalformedMessage:
    """A frame that is no message (``reason``); ``identity`` None when even the routing
    frame is missing."""

    now: float
    identity: bytes | None
    reason: str


@dataclass(frozen=True)
class CheckpointWritten:
    """The commit record completing ``checkpoint_id`` (and the older checkpoints of
    its :class:`PersistCheckpoint`) is on DFS. ``requests``: storage requests on the
    completion path (1: the conditional create succeeded at once); ``metadata_bytes``:
    (checkpoint id, bytes of its metadata in the record) pairs."""

    now: float
    checkpoint_id: int
    requests: int = 1
    metadata_bytes: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class WriteFailed:
    """Writing the commit record of ``checkpoint_id`` (and of the older checkpoints
    of its :class:`PersistCheckpoint`) failed: they are aborted."""

    now: float
    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class CheckpointDeleted:
    """The metadata of subsumed ``checkpoint_id`` is gone (pointer rewritten first)."""

    now: float
    checkpoint_id: int


@dataclass(frozen=True)
class ObjectsDeleted:
    """Of ``paths`` (one :class:`DeleteObjects`), ``deleted`` files existed and are gone."""

    now: float
    paths: tuple[str, ...]
    deleted: int


@dataclass(frozen=True)
class DeleteFailed:
    """A deletion (``what``: a checkpoint's metadata or objects) failed; what is left is
    stale metadata or orphans for the cleanup at the next start."""

    now: float
    what: str
    reason: str


@dataclass(frozen=True)
class OrphansDeleted:
    """The cleanup at start deleted ``orphans`` data files and ``stale_metadata``
    metadata files."""

    now: float
    orphans: int
    stale_metadata: int


@dataclass(frozen=True)
class SplitLogWritten:
    """The split log of a :class:`WriteSplitLog` is at ``path`` (URL), holding ``ids``."""

    now: float
    path: str
    ids: frozenset[str] = field(hash=False)


@dataclass(frozen=True)
class SplitLogFailed:
    """Writing a split log failed (tried again at a later checkpoint)."""

    now: float
    reason: str


@dataclass(frozen=True)
class StopRequested:
    """End the run: the next checkpoint is triggered at once (or right after the one
    in flight) and is final."""

    now: float


@dataclass(frozen=True)
class SplitsListed:
    """A :class:`ListSplits` returned ``listing`` (the source's splits at that time)."""

    now: float
    listing: Listing = field(hash=False)


@dataclass(frozen=True)
class ListingFailed:
    """A :class:`ListSplits` raised (``reason``); the next listing follows an interval
    later."""

    now: float
    reason: str


@dataclass(frozen=True)
class SinkCommitted:
    """The :class:`CommitSink` of ``checkpoint_id`` succeeded: the committables of that
    checkpoint and every earlier one are visible; ``files``: final files this commit
    made visible (0 when all were committed before)."""

    now: float
    checkpoint_id: int
    files: int


@dataclass(frozen=True)
class CommitFailed:
    """The :class:`CommitSink` of ``checkpoint_id`` raised (``reason``); it is retried,
    never skipped."""

    now: float
    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class SinkRecovered:
    """The :class:`RecoverSink` at an attempt's start finished: ``files`` final files
    made visible, ``cleaned`` staged files deleted."""

    now: float
    files: int
    cleaned: int


@dataclass(frozen=True)
class SinkRecoveryFailed:
    """The :class:`RecoverSink` raised (``reason``): the attempt triggers no checkpoint;
    begin another attempt."""

    now: float
    reason: str


Event = (
    Tick
    | Started
    | AttemptStarted
    | MessageFromTask
    | MalformedMessage
    | CheckpointWritten
    | WriteFailed
    | CheckpointDeleted
    | ObjectsDeleted
    | DeleteFailed
    | OrphansDeleted
    | StopRequested
    | SplitsListed
    | ListingFailed
    | SinkCommitted
    | CommitFailed
    | SinkRecovered
    | SinkRecoveryFailed
    | SplitLogWritten
    | SplitLogFailed
)

# -- instructions: messages --------------------------------------------------------------


@dataclass(frozen=True)
class SendToTask:
    """Send ``message`` to task ``task`` of the current attempt, connected as
    ``identity``."""

    task: int
    identity: bytes
    message: protocol.Command


@dataclass(frozen=True)
class Reply:
    """Answer the peer ``identity`` (a stale task: Fenced; a bad message: ErrorReply)."""

    identity: bytes
    message: protocol.Fenced | protocol.ErrorReply


# -- instructions: storage (off the event loop, each answered by one event) --------------


@dataclass(frozen=True)
class PersistCheckpoint:
    """Complete ``earlier`` (older checkpoints, ascending) and ``checkpoint`` with one
    commit record naming ``retained`` (the ids retained afterwards): the commit point,
    one conditional create (coordinator/store.py); answered by CheckpointWritten or
    WriteFailed for ``checkpoint``'s id. ``seq``: None from the state machine; the
    shell reserves it when it queues the write (records complete in that order)."""

    checkpoint: CompletedCheckpoint
    retained: tuple[int, ...]
    earlier: tuple[CompletedCheckpoint, ...] = ()
    seq: int | None = None  # the record's sequence number, reserved by the shell

    @property
    def checkpoints(self) -> tuple[CompletedCheckpoint, ...]:
        """Every checkpoint the record completes, oldest first."""
        return (*self.earlier, self.checkpoint)


@dataclass(frozen=True)
class DeleteCheckpoint:
    """Delete the metadata of a subsumed checkpoint (before its objects); answered by
    CheckpointDeleted or DeleteFailed."""

    checkpoint_id: int


@dataclass(frozen=True)
class DeleteObjects:
    """Delete these object paths: no retained checkpoint references them any more;
    answered by ObjectsDeleted or DeleteFailed. ``logs``: the log ids of this job's
    writers; an object outside the job's own folders (written by a node that other
    jobs' writers may share) is deleted only if every segment in it is of one of them."""

    paths: tuple[str, ...]
    logs: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CleanOrphans:
    """Delete data files not in ``referenced`` and metadata files no pointer names
    (only safe before the first attempt writes); answered by OrphansDeleted."""

    referenced: frozenset[str]


@dataclass(frozen=True)
class WriteSplitLog:
    """Write the finished split ``ids`` of a completed checkpoint to a new split log
    under ``<job>/materialized/`` (coordinator/splitlog.py), off the completion path;
    answered by SplitLogWritten or SplitLogFailed."""

    ids: frozenset[str] = field(hash=False)


@dataclass(frozen=True)
class ListSplits:
    """Call ``enumerator.list_splits()`` (I/O only, leaves the enumerator unchanged);
    answered by SplitsListed or ListingFailed."""

    enumerator: SplitEnumerator = field(hash=False)


@dataclass(frozen=True)
class CommitSink:
    """Make the sink's staged ``committables`` visible (``SinkCommitter.commit``,
    idempotent): those of durable checkpoint ``checkpoint_id`` and of every earlier
    durable checkpoint not committed yet; answered by SinkCommitted or CommitFailed."""

    checkpoint_id: int
    committables: tuple[Committable, ...]


@dataclass(frozen=True)
class RecoverSink:
    """At an attempt's start (no task of it has written yet): run every commit of
    ``commits`` in order (the retained checkpoints', oldest first, then any durable one
    not committed), then ``SinkCommitter.cleanup(keep, keep_attempts=())``: delete
    every staged file not named in ``keep`` (aborted checkpoints, failed attempts);
    answered by SinkRecovered or SinkRecoveryFailed."""

    commits: tuple[CommitSink, ...]
    keep: tuple[Committable, ...]


# -- instructions: notices (logs and metrics) --------------------------------------------


@dataclass(frozen=True)
class CheckpointCompleted:
    """``checkpoint`` is written, ``duration_s`` seconds after its trigger;
    ``requests``: storage requests on its completion path; ``metadata_bytes``: bytes of
    its metadata in the commit record (0: subsumed at once, not written)."""

    checkpoint: CompletedCheckpoint
    duration_s: float
    requests: int = 1
    metadata_bytes: int = 0


@dataclass(frozen=True)
class CheckpointTriggered:
    """Checkpoint ``checkpoint_id`` was triggered ``interval_s`` seconds after the
    previous trigger (None for the first); ``in_flight`` checkpoints are in flight
    now, this one included."""

    checkpoint_id: int
    interval_s: float | None
    in_flight: int


@dataclass(frozen=True)
class CheckpointAborted:
    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class MaterializationStarted:
    epoch: int


@dataclass(frozen=True)
class MaterializationApplied:
    """Every task reported for ``epoch``; ``refs``: task -> its snapshot."""

    epoch: int
    refs: dict[int, MaterializedRef] = field(hash=False)


@dataclass(frozen=True)
class MaterializationAbandoned:
    epoch: int
    reason: str


@dataclass(frozen=True)
class RunFinished:
    """Final checkpoint ``checkpoint`` is durable and its sink output committed: the
    run is over (every task was sent ``protocol.Finish``)."""

    checkpoint: CompletedCheckpoint


@dataclass(frozen=True)
class MessageIgnored:
    """A message that is not stale but does not apply (unknown task, late ack)."""

    task: int
    reason: str


Instruction = (
    SendToTask
    | Reply
    | PersistCheckpoint
    | DeleteCheckpoint
    | DeleteObjects
    | CleanOrphans
    | ListSplits
    | CommitSink
    | RecoverSink
    | WriteSplitLog
    | CheckpointCompleted
    | CheckpointTriggered
    | CheckpointAborted
    | MaterializationStarted
    | MaterializationApplied
    | MaterializationAbandoned
    | RunFinished
    | MessageIgnored
)
#: Instructions the service hands to its storage worker.
StorageInstruction = (
    PersistCheckpoint
    | DeleteCheckpoint
    | DeleteObjects
    | CleanOrphans
    | ListSplits
    | CommitSink
    | RecoverSink
    | WriteSplitLog
)


# -- the in-run orphan sweep (issued by the service, coordinator/sweep.py) ---------------


@dataclass(frozen=True)
class SweepOrphans:
    """Delete the data files under the job's prefix not in ``referenced`` and last
    modified before ``cutoff`` (epoch seconds; None: whatever their age, the final
    sweep of a finished run), and metadata files no pointer names, after checking this
    driver still owns the job; answered by OrphansDeleted or DeleteFailed."""

    referenced: frozenset[str]
    cutoff: float | None
    final: bool = False
