"""One writer (state-backend instance) of the changelog: FLIP-158's StateChangelogWriter.

SQN rules (the off-by-one contract):
- The active changeset has SQN ``s``; ``append`` adds to it.
- ``next_sqn()`` closes the active changeset if it holds any change and returns the new
  active SQN: every change appended so far has a lower SQN.
- ``persist_durably(after)`` first calls ``next_sqn()`` (= ``to``) and returns a handle
  for [after, to): every change with ``after <= sqn < to``. Earlier uploads overlapping
  that range are reused, not re-uploaded; the handle's range filters their other changes
  on read (FLIP-158, Example, CP2 and CP3).
- ``truncate(before)`` drops changes with SQN < ``before`` and the references to uploads
  lying entirely below it (FLIP-158, Example, "State materialization completes").
- A failed upload keeps its changes: the next ``persist_durably`` covering them uploads
  them again.
- Back-pressure: with an ``InFlightLimit`` shared by the client's writers, starting an
  upload (pre-emptive from ``append``, or from ``persist_durably``) blocks while the
  bytes sent but not yet durable would exceed the limit (Flink: 100 MB).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from dstltree.client.batching import PersistItem
from dstltree.client.errors import DstlError, PersistError
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.inflight import InFlightLimit
from dstltree.client.segment import (
    SegmentMeta,
    encode_segment,
    segment_crc,
    segment_key_groups,
)
from dstltree.client.uploader import SegmentUploader


@dataclass
class _SegmentUpload:
    sqn_from: int
    sqn_to: int
    future: Future[SegmentRef | None]

    def failed(self) -> bool:
        return self.future.done() and self.future.exception() is not None


@dataclass(frozen=True)
class WriterStatistics:
    """A snapshot of a writer: SQNs, bytes held in memory, uploads referenced."""

    log_id: str
    active_sqn: int
    truncated_before: int
    bytes_in_memory: int
    bytes_not_uploaded: int
    uploads: int
    uploads_started: int


class ChangelogWriter:
    """Appends changes of ``key_groups`` and makes them durable through an uploader.

    Thread-safe: ``append`` from the task thread, futures resolved by upload threads.
    """

    compression: str | None = None  # segment codec (client/segment.py CODECS); None: off

    def __init__(
        self,
        log_id: str,
        key_groups: range,
        uploader: SegmentUploader,
        initial_sqn: int = 0,
        preemptive_bytes: int = 5 * 1024 * 1024,
        in_flight: InFlightLimit | None = None,
    ) -> None:
        if not log_id or len(log_id) > 256:
            raise ValueError("log_id must be 1..256 characters")
        self.log_id = log_id
        self.key_groups = key_groups
        self._uploader = uploader
        self._preemptive = preemptive_bytes
        self._in_flight = in_flight
        self._lock = threading.RLock()
        self._sqn = initial_sqn
        self._truncated = initial_sqn
        self._uploaded_to = initial_sqn
        self._changesets: dict[int, dict[int, list[bytes]]] = {}
        self._sizes: dict[int, int] = defaultdict(int)
        self._not_uploaded = 0  # bytes with SQN >= _uploaded_to (kept, not summed per append)
        self._uploads: list[_SegmentUpload] = []
        self._uploads_started = 0
        self._closed = False
        uploader.register(log_id)

    # -- FLIP-158 API ------------------------------------------------------------------
    def append(self, key_group: int, change: bytes) -> None:
        """Append ``change`` (bytes) for ``key_group`` to the active changeset.
        Raises ValueError for a key group outside this writer's range, DstlError if closed."""
        if key_group not in self.key_groups:
            raise ValueError(f"key group {key_group} outside {self.key_groups}")
        if not isinstance(change, bytes | bytearray | memoryview):
            raise TypeError("change must be bytes")
        with self._lock:
            self._check_open()
            self._changesets.setdefault(self._sqn, {}).setdefault(key_group, []).append(
                bytes(change)
            )
            self._sizes[self._sqn] += len(change)
            self._not_uploaded += len(change)
            if self._not_uploaded >= self._preemptive:
                self._preemptive_upload()

    def next_sqn(self) -> int:
        """Close the active changeset (if it holds changes); return the new active SQN."""
        with self._lock:
            if self._sqn in self._changesets:
                self._sqn += 1
            return self._sqn

    def persist_durably(
        self, after: int, *, checkpoint_id: int | None = None
    ) -> Future[ChangelogHandle]:
        """Make every change with ``after <= sqn < next_sqn()`` durable.

        ``checkpoint_id`` (optional) lets nodes flush as soon as every writer persisted
        for that checkpoint. Raises ValueError if ``after`` is below the truncation point.
        The future fails with PersistError when an upload fails; changes stay in memory.
        """
        with self._lock:
            self._check_open()
            if after < self._truncated:
                raise ValueError(
                    f"persist after {after}: changes before {self._truncated} were truncated"
                )
            to = self.next_sqn()
            self._reupload_failed(after, to, checkpoint_id)
            if self._uploaded_to < to and self._has_changes(self._uploaded_to, to):
                self._start_upload(self._uploaded_to, to, checkpoint_id)
            elif checkpoint_id is not None:
                self._uploader.submit(PersistItem.marker(self.log_id, to, checkpoint_id))
            self._uploaded_to = max(self._uploaded_to, to)
            self._not_uploaded = 0  # everything before ``to`` is uploaded; ``to`` is empty
            relevant = [u for u in self._uploads if u.sqn_to > after and u.sqn_from < to]
        return _combine(self.log_id, (after, to), relevant)

    def truncate(self, before: int) -> None:
        """Drop changes with SQN < ``before`` and uploads lying entirely below it."""
        with self._lock:
            before = min(before, self._sqn)
            if before <= self._truncated:
                return
            for sqn in [s for s in self._changesets if s < before]:
                del self._changesets[sqn]
                self._sizes.pop(sqn, None)
            self._uploads = [u for u in self._uploads if u.sqn_to > before]
            self._truncated = before
            self._uploaded_to = max(self._uploaded_to, before)
            self._not_uploaded = self._count_not_uploaded()

    def close(self) -> None:
        """Stop accepting appends and unregister from the uploader. Changes not yet
        persisted are dropped (FLIP-158 API)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._uploader.unregister(self.log_id)

    # -- introspection -----------------------------------------------------------------
    @property
    def truncated_before(self) -> int:
        return self._truncated

    def statistics(self) -> WriterStatistics:
        with self._lock:
            return WriterStatistics(
                self.log_id,
                self._sqn,
                self._truncated,
                sum(self._sizes.values()),
                self._not_uploaded,
                len(self._uploads),
                self._uploads_started,
            )

    # -- internals ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise DstlError(f"writer {self.log_id} is closed")

    def _count_not_uploaded(self) -> int:
        return sum(n for s, n in self._sizes.items() if s >= self._uploaded_to)

    def _has_changes(self, lo: int, hi: int) -> bool:
        return any(lo <= s < hi for s in self._changesets)

    def _preemptive_upload(self) -> None:
        to = self.next_sqn()
        self._start_upload(self._uploaded_to, to, None)
        self._uploaded_to = to
        self._not_uploaded = 0

    def _reupload_failed(self, after: int, to: int, checkpoint_id: int | None) -> None:
        for i, u in enumerate(self._uploads):
            if u.sqn_to > after and u.sqn_from < to and u.failed():
                lo = max(u.sqn_from, self._truncated)
                self._uploads[i] = self._make_upload(lo, u.sqn_to, checkpoint_id)

    def _start_upload(self, lo: int, hi: int, checkpoint_id: int | None) -> None:
        self._uploads.append(self._make_upload(lo, hi, checkpoint_id))

    def _make_upload(self, lo: int, hi: int, checkpoint_id: int | None) -> _SegmentUpload:
        changes = {s: cs for s, cs in self._changesets.items() if lo <= s < hi}
        data = encode_segment(self.log_id, lo, hi, changes, compression=self.compression)
        kgs = segment_key_groups(changes)
        meta = SegmentMeta(self.log_id, lo, hi, kgs, len(data), segment_crc(data))
        item = PersistItem(meta, checkpoint_id, data)
        self._uploads_started += 1
        limit, size = self._in_flight, len(data)
        if limit is not None:
            limit.acquire(size)  # back-pressure: blocks append/persist while too much is in flight
        try:
            fut = self._uploader.submit(item)
        except Exception as e:  # noqa: BLE001 - a refused submit is a failed upload
            fut = Future()
            fut.set_exception(e)
        if limit is not None:
            fut.add_done_callback(lambda _: limit.release(size))
        return _SegmentUpload(lo, hi, fut)


def _combine(
    log_id: str, sqn_range: tuple[int, int], uploads: Sequence[_SegmentUpload]
) -> Future[ChangelogHandle]:
    """A future of the handle over ``uploads``; fails if any of them fails."""
    out: Future[ChangelogHandle] = Future()
    if not uploads:
        out.set_result(ChangelogHandle(log_id, sqn_range, ()))
        return out
    remaining = [len(uploads)]
    lock = threading.Lock()

    def done(_: Future[SegmentRef | None]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0] or out.done():
                return
        errors = [u.future.exception() for u in uploads if u.future.exception() is not None]
        if errors:
            err = PersistError(f"{log_id}: persist of SQN {sqn_range} failed: {errors[0]}")
            err.__cause__ = errors[0]
            out.set_exception(err)
            return
        refs = sorted(
            (r for u in uploads if (r := u.future.result()) is not None),
            key=lambda r: (r.sqn_from, r.sqn_to),
        )
        out.set_result(ChangelogHandle(log_id, sqn_range, tuple(refs)))

    for u in uploads:
        u.future.add_done_callback(done)
    return out
