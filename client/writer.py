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
  upload (pre-emptive from ``append`` or ``flush_staged``, or from ``persist_durably``)
  blocks while the bytes sent but not yet durable would exceed the limit (Flink: 100 MB).
- Batched appends (``staging(key_group)``: a list the task thread appends change bytes
  to, no lock, no call per change) follow the same rules: ``next_sqn`` and
  ``persist_durably`` fold every staged change into the active changeset first, so a
  change staged before ``next_sqn()`` returns ``s`` has an SQN below ``s``.
- Last-wins staging (``last_wins(key_group, prefix)``: a dict from key bytes to value
  bytes, or None) is for state whose change of a key replaces every earlier change of
  that key (value state): of the entries a producer stages for a key between two folds
  of the dict, only the last one is logged. A fold logs the dict's entries as ONE
  change, ``prefix`` followed by the dict in msgpack's map encoding (keys and values as
  bin, None as nil): one C-level pack per dict, not a render and a length per entry.
  The dicts fold at ``next_sqn``, ``persist_durably`` and ``statistics`` (so the SQN
  rule above holds for them too) and, at ``flush_staged``, once they hold
  ``squash_entries`` keys; not at every ``flush_staged``, which is what lets repeated
  updates of a key within one checkpoint interval cost one entry. Replay gives the
  same state as logging every change (the restore squash of FLIP-151 applied before
  the upload). ``squash_entries=0`` asks state backends not to use last-wins staging
  (every change logged, as Flink does).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import compress, takewhile

import msgpack

from dstltree.client.batching import PersistItem
from dstltree.client.errors import DstlError, PersistError
from dstltree.client.futures import SegmentFuture, UploadFuture
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.inflight import InFlightLimit
from dstltree.client.segment import (
    SegmentMeta,
    encode_segment_parts,
    segment_crc,
    segment_key_groups,
    segment_size,
)
from dstltree.client.uploader import SegmentUploader

_BYTES_LIKE = (bytes, bytearray, memoryview)
DEFAULT_SQUASH_ENTRIES = 65536  # keys last-wins dicts hold before flush_staged folds them

# a last-wins staging dict: key bytes -> value bytes (a set) or None (a clear)
LastWins = dict[bytes, bytes | None]


@dataclass
class _SegmentUpload:
    sqn_from: int
    sqn_to: int
    future: UploadFuture[SegmentRef | None]

    def failed(self) -> bool:
        return self.future.done() and self.future.exception() is not None


class _Release:
    """The callback that gives an upload's bytes back to the in-flight limit: one
    object (a lambda is four the cycle collector tracks: function, closure, two cells)
    and no reference to the future (a cycle through a Future, which keeps its
    callbacks, would be left to the collector)."""

    __slots__ = ("limit", "size")

    def __init__(self, limit: InFlightLimit, size: int) -> None:
        self.limit, self.size = limit, size

    def __call__(self, _: object) -> None:
        self.limit.release(self.size)


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

    Thread-safe: ``append`` from the task thread, futures resolved by upload threads;
    every method may be called from any thread. Batched appends go through
    :meth:`staging`: lists of change bytes, one per key group, that ONE producer thread
    appends to without a lock and that the writer folds into the active changeset at
    :meth:`flush_staged`, ``append`` (of that key group), ``next_sqn``,
    ``persist_durably`` and ``statistics``: a staged change takes the active SQN of the
    fold that sees it, so every change staged before ``next_sqn()`` has a lower SQN.
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
        squash_entries: int = DEFAULT_SQUASH_ENTRIES,
    ) -> None:
        if not log_id or len(log_id) > 256:
            raise ValueError("log_id must be 1..256 characters")
        self.log_id = log_id
        self.key_groups = key_groups
        self._uploader = uploader
        self._preemptive = preemptive_bytes
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self._sqn = initial_sqn
        self._truncated = initial_sqn
        self._uploaded_to = initial_sqn
        self._active: dict[int, list[bytes]] = {}  # the changeset of SQN _sqn
        self._active_bytes = 0
        self._changesets: dict[int, dict[int, list[bytes]]] = {}  # closed, SQN < _sqn
        self._sizes: dict[int, int] = {}  # bytes per closed changeset
        self._staged: dict[int, list[bytes]] = {}  # key group -> staging list
        # (key group, change prefix) -> last-wins dict
        self._last_wins: dict[tuple[int, bytes], LastWins] = {}
        if squash_entries < 0:
            raise ValueError(f"squash_entries must be >= 0, got {squash_entries}")
        self.squash_entries = squash_entries  # 0: state backends log every change
        self._producer: int | None = None  # thread id of the last-wins producer
        self._not_uploaded = 0  # bytes with SQN >= _uploaded_to (kept, not summed per append)
        self._uploads: list[_SegmentUpload] = []
        self._uploads_started = 0
        self._closed = False
        uploader.register(log_id)

    # -- FLIP-158 API ------------------------------------------------------------------
    def append(self, key_group: int, change: bytes | bytearray | memoryview) -> None:
        """Append ``change`` (bytes, bytearray or memoryview; copied unless bytes) for
        ``key_group`` to the active changeset. Raises ValueError for a key group outside
        this writer's range, TypeError for other types, DstlError if closed."""
        if key_group not in self.key_groups:
            raise ValueError(f"key group {key_group} outside {self.key_groups}")
        if type(change) is not bytes:
            if not isinstance(change, _BYTES_LIKE):
                raise TypeError("change must be bytes")
            change = bytes(change)
        with self._lock:
            if self._closed:
                raise DstlError(f"writer {self.log_id} is closed")
            if self._staged.get(key_group) or any(self._last_wins.values()):
                self._fold()  # staged changes go first
            changes = self._active.get(key_group)
            if changes is None:
                self._active[key_group] = [change]
            else:
                changes.append(change)
            n = len(change)
            self._active_bytes += n
            self._not_uploaded += n
            if self._not_uploaded >= self._preemptive:
                self._preemptive_upload()

    def staging(self, key_group: int) -> list[bytes]:
        """The staging list of ``key_group`` (the same list on every call): one producer
        thread may append change ``bytes`` (bytes objects only, never mutated later) to
        it without a lock; they join the active changeset at the next fold (class
        docstring), in order. Call :meth:`flush_staged` now and then (every few
        hundred records) so that pre-emptive uploads and back-pressure see the bytes.
        Raises ValueError for a key group outside this writer's range."""
        changes = self._staged.get(key_group)
        if changes is None:
            if key_group not in self.key_groups:
                raise ValueError(f"key group {key_group} outside {self.key_groups}")
            with self._lock:
                changes = self._staged.setdefault(key_group, [])
        return changes

    def last_wins(self, key_group: int, prefix: bytes) -> LastWins:
        """The last-wins staging dict of ``key_group`` and ``prefix`` (the same dict on
        every call; module docstring): one producer thread may set ``d[key] = value``
        or ``d[key] = None``, bytes only, without a lock. A fold logs the entries as
        the one change ``prefix + msgpack.packb(d)``. Only for state in which a key's
        entry replaces all its earlier ones and commutes with the changes of other keys
        and other states. Raises ValueError for a key group outside this writer's
        range."""
        slot = (key_group, prefix)
        d = self._last_wins.get(slot)
        if d is None:
            if key_group not in self.key_groups:
                raise ValueError(f"key group {key_group} outside {self.key_groups}")
            with self._lock:
                d = self._last_wins.setdefault(slot, {})
                self._producer = threading.get_ident()
        return d

    def flush_staged(self) -> None:
        """Fold the staged lists into the active changeset (and the last-wins dicts once
        they hold ``squash_entries`` keys); start a pre-emptive upload once enough bytes
        are not uploaded (blocks under back-pressure, as ``append``). Raises DstlError if
        closed (staged changes are then dropped)."""
        with self._lock:
            if self._closed:
                self._drop_staged()
                raise DstlError(f"writer {self.log_id} is closed")
            squash = sum(map(len, self._last_wins.values())) < self.squash_entries
            self._fold(squash=squash)
            if self._not_uploaded >= self._preemptive:
                self._preemptive_upload()

    def next_sqn(self) -> int:
        """Close the active changeset (if it holds changes, staged ones included);
        return the new active SQN."""
        with self._lock:
            return self._next_sqn()

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
            to = self._next_sqn()
            first = self._first_upload_after(after)
            self._reupload_failed(first, to, checkpoint_id)
            if self._uploaded_to < to and self._has_changes(self._uploaded_to, to):
                self._start_upload(self._uploaded_to, to, checkpoint_id)
            elif checkpoint_id is not None:
                self._uploader.submit(PersistItem.marker(self.log_id, to, checkpoint_id))
            self._uploaded_to = max(self._uploaded_to, to)
            self._not_uploaded = 0  # everything before ``to`` is uploaded; ``to`` is empty
            relevant = [u for u in self._uploads[first:] if u.sqn_to > after and u.sqn_from < to]
        return _combine(self.log_id, (after, to), relevant)

    def truncate(self, before: int) -> None:
        """Drop changes with SQN < ``before`` and uploads lying entirely below it."""
        with self._lock:
            before = min(before, self._sqn)
            if before <= self._truncated:
                return
            dropped = list(takewhile(lambda s: s < before, self._changesets))  # SQN order
            for sqn in dropped:
                del self._changesets[sqn]
                del self._sizes[sqn]
            uploads, i = self._uploads, 0  # in SQN order: the dropped ones come first
            while i < len(uploads) and uploads[i].sqn_to <= before:
                i += 1
            del uploads[:i]
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
        """A snapshot (staged changes folded first); bytes are change bytes."""
        with self._lock:
            self._fold()
            return WriterStatistics(
                self.log_id,
                self._sqn,
                self._truncated,
                sum(self._sizes.values()) + self._active_bytes,
                self._not_uploaded,
                len(self._uploads),
                self._uploads_started,
            )

    # -- internals (the lock held) -----------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise DstlError(f"writer {self.log_id} is closed")

    def _drop_staged(self) -> None:
        for changes in self._staged.values():
            del changes[:]
        for d in self._last_wins.values():
            d.clear()

    def _fold(self, squash: bool = False) -> None:
        """Move the staged changes into the active changeset: the lists' and, unless
        ``squash`` (keep squashing), the last-wins dicts'. A change a producer stages
        meanwhile stays staged (only the first ``n`` are taken, atomically)."""
        added = 0 if squash else self._fold_last_wins()
        active = self._active
        # the non-empty staging lists only, picked in C (a writer of many key groups
        # stages in few of them between folds; most folds find every list empty)
        staged_lists = self._staged
        for kg, staged in compress(staged_lists.items(), staged_lists.values()):
            n = len(staged)
            chunk = staged[:n]
            del staged[:n]
            changes = active.get(kg)
            if changes is None:
                active[kg] = chunk
            else:
                changes += chunk
            added += sum(map(len, chunk))  # no copy, whatever the changes' size
        self._active_bytes += added
        self._not_uploaded += added

    def _fold_last_wins(self) -> int:
        """Log each non-empty last-wins dict as one change of the active changeset and
        empty it: on the producer's thread all at once, on any other ``len(d)`` pops
        (keys the producer sets meanwhile stay for the next fold). Returns the bytes
        added."""
        added = 0
        for (kg, prefix), d in self._last_wins.items():
            n = len(d)
            if not n:
                continue
            if threading.get_ident() == self._producer:  # nobody sets keys meanwhile
                change = prefix + msgpack.packb(d)
                d.clear()
            else:
                pop = d.popitem
                change = prefix + msgpack.packb(dict([pop() for _ in range(n)]))
            changes = self._active.get(kg)
            if changes is None:
                self._active[kg] = [change]
            else:
                changes.append(change)
            added += len(change)
        return added

    def _next_sqn(self) -> int:
        self._fold()
        if self._active:
            self._changesets[self._sqn] = self._active
            self._sizes[self._sqn] = self._active_bytes
            self._active, self._active_bytes = {}, 0
            self._sqn += 1
        return self._sqn

    def _count_not_uploaded(self) -> int:
        """Bytes of changesets from ``_uploaded_to`` on, active included: scanned from
        the newest (SQNs rise in insertion order), O(changesets not uploaded)."""
        lo = self._uploaded_to
        closed = sum(n for _, n in takewhile(lambda e: e[0] >= lo, reversed(self._sizes.items())))
        return closed + self._active_bytes

    def _has_changes(self, lo: int, hi: int) -> bool:
        """Whether a changeset has ``lo <= sqn < hi`` (from the newest, stops at once)."""
        for s in reversed(self._changesets):
            if s < lo:
                return False
            if s < hi:
                return True
        return False

    def _changes_in(self, lo: int, hi: int) -> dict[int, dict[int, list[bytes]]]:
        """The changesets with ``lo <= sqn < hi``, scanned from the newest (SQNs rise in
        insertion order): O(changesets from ``lo`` on), not O(all kept)."""
        out = {}
        for s in reversed(self._changesets):
            if s < lo:
                break
            if s < hi:
                out[s] = self._changesets[s]
        return dict(reversed(out.items()))

    def _first_upload_after(self, after: int) -> int:
        """Index of the first upload ending above ``after`` (uploads are in SQN order):
        scanned from the newest, O(uploads after it)."""
        i = len(self._uploads)
        while i and self._uploads[i - 1].sqn_to > after:
            i -= 1
        return i

    def _preemptive_upload(self) -> None:
        to = self._next_sqn()
        if self._has_changes(self._uploaded_to, to):
            self._start_upload(self._uploaded_to, to, None)
        self._uploaded_to = to
        self._not_uploaded = 0

    def _reupload_failed(self, first: int, to: int, checkpoint_id: int | None) -> None:
        for i in range(first, len(self._uploads)):
            u = self._uploads[i]
            if u.sqn_from < to and u.failed():
                lo = max(u.sqn_from, self._truncated)
                self._uploads[i] = self._make_upload(lo, u.sqn_to, checkpoint_id)

    def _start_upload(self, lo: int, hi: int, checkpoint_id: int | None) -> None:
        self._uploads.append(self._make_upload(lo, hi, checkpoint_id))

    def _make_upload(self, lo: int, hi: int, checkpoint_id: int | None) -> _SegmentUpload:
        changes = self._changes_in(lo, hi)
        parts = encode_segment_parts(self.log_id, lo, hi, changes, compression=self.compression)
        data = parts[0] if len(parts) == 1 else tuple(parts)  # large changes: never copied
        size = segment_size(data)
        meta = SegmentMeta(
            self.log_id, lo, hi, segment_key_groups(changes), size, segment_crc(data)
        )
        item = PersistItem(meta, checkpoint_id, data)
        self._uploads_started += 1
        limit = self._in_flight
        if limit is not None:
            limit.acquire(size)  # back-pressure: blocks append/persist while too much is in flight
        fut: UploadFuture[SegmentRef | None]
        try:
            fut = self._uploader.submit(item)
        except Exception as e:  # noqa: BLE001 - a refused submit is a failed upload
            refused: SegmentFuture[SegmentRef | None] = SegmentFuture()
            refused.set_exception(e)
            fut = refused
        if limit is not None:
            fut.add_done_callback(_Release(limit, size))
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
    # emptied by the last callback: a future keeps its callbacks, so a closure holding
    # the uploads would make a reference cycle per persist (left to the cycle collector)
    pending = list(uploads)

    def done(_: UploadFuture[SegmentRef | None]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0] or out.done():
                return
            uploads = pending.copy()
            pending.clear()
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
