"""Prometheus metrics of the checkpoint coordinator.

Served on ``http://HOST:PORT/metrics`` from the coordinator's own registry when the
:class:`dstltree.coordinator.service.Coordinator` is given ``metrics_port`` (0 = a free port,
see :attr:`CoordinatorMetrics.url`); off by default.

- ``dstl_checkpoint_duration_seconds`` (histogram): from the trigger to the checkpoint
  commit record (its metadata) written on DFS.
- ``dstl_checkpoint_size_bytes`` (histogram): the changelog bytes a checkpoint adds,
  i.e. the lengths of the segments its handles reference that the previous completed
  checkpoint did not reference (what the tasks persisted for it), channel-state
  segments (FLIP-76 in-flight records) counted like state changelog segments.
  Materialized snapshots and the metadata file itself are not counted.
- ``dstl_checkpoint_sync_seconds`` and ``dstl_checkpoint_async_seconds``
  (histograms): per checkpoint, the longest synchronous phase at any task (from its
  aligned barrier to its persist started and sink output staged; the task stops for
  it) and the longest asynchronous phase (to the persist durable; the task goes on).
- Unaligned checkpoints (FLIP-76), per completed checkpoint:
  ``dstl_checkpoint_alignment_seconds`` (histogram): the longest alignment at any task
  (from the first barrier of the checkpoint on any of its input channels to the last);
  ``dstl_checkpoint_start_delay_seconds`` (histogram): the longest start delay (from a
  task's receipt of the trigger to its first barrier); ``dstl_checkpoint_inflight_bytes``
  (histogram, 0 B and 1 KiB to 4 GiB in steps of 4x): the bytes of in-flight records
  all tasks persisted for it; ``dstl_checkpoints_unaligned_total``: checkpoints that
  some task took unaligned (at once, or after an aligned-checkpoint timeout).
- ``dstl_checkpoint_interval_seconds`` (histogram): the interval achieved, from one
  checkpoint's trigger to the next (the first trigger is not observed); with
  overlapping checkpoints it follows the configured interval while earlier checkpoints
  are still completing. ``dstl_checkpoints_in_flight`` (gauge): checkpoints triggered
  and neither completed nor aborted at the latest trigger, that one included (at most
  ``max_concurrent_checkpoints``).
- ``dstl_checkpoint_completion_requests`` (histogram, buckets 1 to 32): per completed
  checkpoint, the storage requests on its completion path (from the last task's
  acknowledgement to its commit point; 1 when its conditional create succeeds at once).
- ``dstl_checkpoint_metadata_bytes`` (histogram, 256 B to 4 MiB in steps of 4x): per
  completed checkpoint, the bytes of its metadata as written.
- ``dstl_checkpoints_completed_total``, ``dstl_checkpoints_aborted_total`` (timeouts,
  failed metadata writes, a new task attempt).
- ``dstl_materialization_duration_seconds`` (histogram): from the trigger of an epoch
  to the last task's report; ``dstl_materialization_size_bytes`` (histogram): the sum
  of the tasks' snapshot sizes of that epoch; ``dstl_materialization_written_bytes``
  (histogram): of those, the bytes written for that epoch (an incremental
  materialization references the rest from earlier ones).
- ``dstl_materializations_completed_total``, ``dstl_materializations_abandoned_total``.
- ``dstl_objects_deleted_total`` (released by the shared state registry),
  ``dstl_orphans_deleted_total`` (cleanup at start and in-run sweeps),
  ``dstl_deletes_refused_total`` (paths outside the job's prefix, or of a fenced
  driver), ``dstl_shared_objects_kept_total`` (released objects of nodes by host kept:
  a segment of another job's log in them, or an unreadable index),
  ``dstl_checkpoint_writes_fenced_total`` (another driver took the job over).
- ``dstl_messages_fenced_total`` (from stale task attempts),
- ``dstl_tasks_without_node`` (tasks writing straight to the DFS: no node on their host),
  ``dstl_messages_rejected_total`` (malformed or not task messages, answered with an
  error), ``dstl_messages_refused_total{kind}`` (every refused message by kind:
  ``malformed``, ``type``, ``hello``, ``identity``, ``path``, ``sqn``, ``bounds``,
  ``key_groups``, ``checkpoint``, ``epoch``, ``duplicate``, ``splits``, ``state``).
- ``dstl_last_checkpoint_id`` (gauge, -1 before the first).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dstltree.client.metrics_endpoint import ConsistentRegistry, MetricsEndpoint
from dstltree.coordinator.checkpoint import checkpoint_alignment, checkpoint_phases

if TYPE_CHECKING:
    from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef

#: Checkpoint and materialization duration buckets, seconds.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Checkpoint and materialization size buckets, bytes: 1 KiB to 4 GiB in steps of 4x.
SIZE_BUCKETS = tuple(float(1024 * 4**i) for i in range(12))
#: Trigger-to-trigger interval buckets, seconds: fine around the usual 0.1-0.5 s.
INTERVAL_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35)
INTERVAL_BUCKETS += (0.4, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Storage requests on a checkpoint's completion path (1: the conditional create alone).
COMPLETION_REQUEST_BUCKETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0)
#: Checkpoint metadata size buckets, bytes: 256 B to 4 MiB in steps of 4x.
METADATA_BUCKETS = tuple(float(256 * 4**i) for i in range(8))
#: In-flight bytes of a checkpoint (FLIP-76 channel state): 0 (an aligned checkpoint,
#: or an unaligned one with nothing in flight) apart, then :data:`SIZE_BUCKETS`.
INFLIGHT_BUCKETS = (0.0, *SIZE_BUCKETS)


class CoordinatorMetrics:
    """The coordinator's metrics, served on ``host:port`` (0 = a free port, see
    :attr:`port`; None = recorded, not served). Raises OSError if the port cannot be
    bound. Thread-safe; :meth:`close` stops the server."""

    def __init__(self, port: int | None, host: str = "127.0.0.1") -> None:
        self.registry = r = ConsistentRegistry()  # a scrape sees a checkpoint whole
        self.checkpoint_duration = Histogram(
            "dstl_checkpoint_duration_seconds",
            "Seconds from checkpoint trigger to metadata written.",
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.checkpoint_sync = Histogram(
            "dstl_checkpoint_sync_seconds",
            "Longest synchronous phase of a checkpoint at any task (barrier to persist started).",
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.checkpoint_async = Histogram(
            "dstl_checkpoint_async_seconds",
            "Longest asynchronous phase of a checkpoint at any task (to the persist durable).",
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.checkpoint_size = Histogram(
            "dstl_checkpoint_size_bytes",
            "Changelog segment bytes a checkpoint references that the previous did not.",
            registry=r,
            buckets=SIZE_BUCKETS,
        )
        self.checkpoints_completed = Counter(
            "dstl_checkpoints_completed", "Checkpoints completed.", registry=r
        )
        self.checkpoints_aborted = Counter(
            "dstl_checkpoints_aborted", "Checkpoints aborted.", registry=r
        )
        self._add_overlap_metrics(r)
        self._add_alignment_metrics(r)
        self._add_materialization_metrics(r)
        self.objects_deleted = Counter(
            "dstl_objects_deleted", "Objects deleted after release by the registry.", registry=r
        )
        self.orphans_deleted = Counter(
            "dstl_orphans_deleted", "Orphan files deleted by cleanup.", registry=r
        )
        self.messages_fenced = Counter(
            "dstl_messages_fenced", "Task messages of stale attempts fenced.", registry=r
        )
        self.messages_rejected = Counter(
            "dstl_messages_rejected", "Malformed or unexpected messages rejected.", registry=r
        )
        self._add_task_metrics(r)
        self._add_storage_counters(r)
        self.last_checkpoint_id = Gauge(
            "dstl_last_checkpoint_id", "Id of the latest completed checkpoint.", registry=r
        )
        self.last_checkpoint_id.set(-1)
        self._lock = threading.Lock()
        self._previous: frozenset[tuple[str, int, int]] = frozenset()
        self._epochs: dict[int, float] = {}  # epoch -> trigger time (monotonic seconds)
        self.endpoint = MetricsEndpoint(r, host, port)
        self.host, self.port = host, self.endpoint.port

    def _add_storage_counters(self, r: CollectorRegistry) -> None:
        self.deletes_refused = Counter(
            "dstl_deletes_refused", "Deletions outside the job's prefix refused.", registry=r
        )
        self.shared_objects_kept = Counter(
            "dstl_shared_objects_kept",
            "Released objects of shared nodes kept: another log's segment in them.",
            registry=r,
        )
        self.writes_fenced = Counter(
            "dstl_checkpoint_writes_fenced",
            "Storage work refused: another driver took the job over.",
            registry=r,
        )

    def _add_overlap_metrics(self, r: CollectorRegistry) -> None:
        """The interval achieved, checkpoints in flight, the completion path's requests
        and the metadata's size (overlapping checkpoints, one commit point)."""
        self.checkpoint_interval = Histogram(
            "dstl_checkpoint_interval_seconds",
            "Seconds from one checkpoint trigger to the next (the interval achieved).",
            registry=r,
            buckets=INTERVAL_BUCKETS,
        )
        self.checkpoints_in_flight = Gauge(
            "dstl_checkpoints_in_flight",
            "Checkpoints in flight at the latest trigger, that one included.",
            registry=r,
        )
        self.checkpoint_completion_requests = Histogram(
            "dstl_checkpoint_completion_requests",
            "Storage requests on a checkpoint's completion path (last ack to commit point).",
            registry=r,
            buckets=COMPLETION_REQUEST_BUCKETS,
        )
        self.checkpoint_metadata_bytes = Histogram(
            "dstl_checkpoint_metadata_bytes",
            "Bytes of a completed checkpoint's metadata as written.",
            registry=r,
            buckets=METADATA_BUCKETS,
        )

    def _add_alignment_metrics(self, r: CollectorRegistry) -> None:
        """Figures of unaligned checkpoints (FLIP-76), per completed checkpoint."""
        self.checkpoint_alignment = Histogram(
            "dstl_checkpoint_alignment_seconds",
            "Longest alignment of a checkpoint at any task (first barrier to last).",
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.checkpoint_start_delay = Histogram(
            "dstl_checkpoint_start_delay_seconds",
            "Longest start delay of a checkpoint at any task (trigger to first barrier).",
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.checkpoint_inflight = Histogram(
            "dstl_checkpoint_inflight_bytes",
            "Bytes of in-flight records (channel state) all tasks persisted for a checkpoint.",
            registry=r,
            buckets=INFLIGHT_BUCKETS,
        )
        self.checkpoints_unaligned = Counter(
            "dstl_checkpoints_unaligned",
            "Completed checkpoints some task took unaligned.",
            registry=r,
        )

    def _add_materialization_metrics(self, r: CollectorRegistry) -> None:
        """Histograms and counters of materialization epochs."""
        self.materialization_duration = Histogram(
            "dstl_materialization_duration_seconds",
            "Seconds from materialization trigger to the last task's report.",
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        self.materialization_size = Histogram(
            "dstl_materialization_size_bytes",
            "Snapshot bytes of all tasks in one materialization epoch.",
            registry=r,
            buckets=SIZE_BUCKETS,
        )
        self.materialization_written = Histogram(
            "dstl_materialization_written_bytes",
            "Snapshot bytes written for one materialization epoch (the rest reused).",
            registry=r,
            buckets=SIZE_BUCKETS,
        )
        self.materializations_completed = Counter(
            "dstl_materializations_completed", "Materialization epochs applied.", registry=r
        )
        self.materializations_abandoned = Counter(
            "dstl_materializations_abandoned", "Materialization epochs abandoned.", registry=r
        )

    def _add_task_metrics(self, r: CollectorRegistry) -> None:
        self.messages_refused = Counter(
            "dstl_messages_refused", "Task messages refused, by kind.", ["kind"], registry=r
        )
        self._refused: dict[str, int] = {}
        self.tasks_without_node = Gauge(
            "dstl_tasks_without_node",
            "Tasks of the current attempt writing their changelog straight to the DFS "
            "(no aggregator node found for their host).",
            registry=r,
        )

    @property
    def url(self) -> str | None:
        """``http://host:port/metrics``, or None when not served."""
        return self.endpoint.url

    def checkpoint_completed(self, checkpoint: CompletedCheckpoint, duration_s: float) -> None:
        """``checkpoint`` is written, ``duration_s`` seconds after its trigger."""
        segments = frozenset(
            (s.path, s.offset, s.length)
            for task in checkpoint.tasks.values()
            for h in (*task.changelog, *task.channel_state)
            for s in h.segments
        )
        with self._lock:
            new = segments - self._previous
            self._previous = segments
        sync_s, async_s = checkpoint_phases(checkpoint)
        alignment_s, start_delay_s, inflight_bytes, unaligned = checkpoint_alignment(checkpoint)
        with self.registry.updating:
            self.checkpoint_duration.observe(max(0.0, duration_s))
            self.checkpoint_sync.observe(sync_s)
            self.checkpoint_async.observe(async_s)
            self.checkpoint_size.observe(sum(length for _, _, length in new))
            self.checkpoint_alignment.observe(alignment_s)
            self.checkpoint_start_delay.observe(start_delay_s)
            self.checkpoint_inflight.observe(inflight_bytes)
            if unaligned:
                self.checkpoints_unaligned.inc()
            self.checkpoints_completed.inc()
            self.last_checkpoint_id.set(checkpoint.checkpoint_id)

    def checkpoint_triggered(self, interval_s: float | None, in_flight: int) -> None:
        """A checkpoint was triggered ``interval_s`` seconds after the previous trigger
        (None for the first: not observed); ``in_flight`` checkpoints are now in flight,
        this one included."""
        if interval_s is not None:
            self.checkpoint_interval.observe(max(0.0, interval_s))
        self.checkpoints_in_flight.set(max(0, in_flight))

    def checkpoint_committed(self, requests: int, metadata_bytes: int) -> None:
        """A checkpoint reached its commit point after ``requests`` storage requests on
        its completion path, its metadata ``metadata_bytes`` bytes as written."""
        self.checkpoint_completion_requests.observe(max(0, requests))
        self.checkpoint_metadata_bytes.observe(max(0, metadata_bytes))

    def refusals(self, counts: Mapping[str, int]) -> None:
        """The coordinator's refusal counts by kind so far (``CoordinatorState
        .rejections``): the counter grows by what is new since the last call."""
        with self._lock:
            new = {k: n - self._refused.get(k, 0) for k, n in counts.items()}
            self._refused.update(counts)
        for kind, n in new.items():
            if n > 0:
                self.messages_refused.labels(kind).inc(n)

    def materialization_started(self, epoch: int, now: float | None = None) -> None:
        """Epoch ``epoch`` was triggered at ``now`` (monotonic seconds, default now)."""
        with self._lock:
            self._epochs[epoch] = time.monotonic() if now is None else now

    def materialization_completed(
        self, epoch: int, refs: dict[int, MaterializedRef], now: float | None = None
    ) -> None:
        """Every task reported ``refs`` for ``epoch``: observe its duration (if its
        trigger was seen) and the snapshot bytes."""
        t = time.monotonic() if now is None else now
        with self._lock:
            started = self._epochs.pop(epoch, None)
            self._epochs = {e: s for e, s in self._epochs.items() if e > epoch}
        with self.registry.updating:
            if started is not None:
                self.materialization_duration.observe(max(0.0, t - started))
            self.materialization_size.observe(sum(ref.size_bytes for ref in refs.values()))
            self.materialization_written.observe(
                sum(r.written_bytes if r.parts else r.size_bytes for r in refs.values())
            )
            self.materializations_completed.inc()

    def materialization_abandoned(self, epoch: int) -> None:
        with self._lock:
            self._epochs.pop(epoch, None)
        self.materializations_abandoned.inc()

    def close(self) -> None:
        """Stop serving (idempotent). Recording still works afterwards."""
        self.endpoint.close()
