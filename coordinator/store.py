"""Completed checkpoints on DFS, under ``<job>/checkpoints/``, and the fencing of drivers.

Layout (format version 4; version 3 is read too)::

    checkpoints/commit-0000000042.json   commit record 42: {"version": 4, "seq": 42,
        "kind": "checkpoint" | "claim", "owner": "<driver token>",
        "retained": [[7, 41], [9, 42]],      checkpoint id -> the record holding it
        "claims": [1, 30],                   every claim record so far
        "checkpoints": [{...metadata of checkpoint 9...}]}

The metadata in a record is compact (coordinator/compact.py): object paths below the
job's folder are relative to it and a segment's key groups are runs.

**The commit point of a checkpoint is one request** (a second, identical one when the
first is slow: coordinator/hedged_create.py): the conditional create (S3
``If-None-Match: *``, POSIX ``link``, see :meth:`ObjectStore.put` ``exclusive``) of the
next commit record, which carries the checkpoint's metadata *and* the retained set
(what a pointer used to say). The newest record (highest sequence number) names the
latest checkpoint and every retained one. A record holds the metadata of the
checkpoints it completes that stay retained; several checkpoints that became ready
while the previous create was in flight complete in one record. Nothing else is on the
completion path: records of subsumed checkpoints, released objects and stale files are
deleted afterwards, off the critical path (coordinator/storage_worker.py).

Crash safety: a record is created whole or not at all. Before its create the previous
record is the latest; after it the new one is. A crash after the create leaves at
most records and objects no retained checkpoint needs, which :meth:`stale_files` and
the orphan sweeps remove. The newest record is never deleted (it names the latest
checkpoint, or it is a claim).

Fencing (one driver per job), without a listing after the create: record sequence
numbers are contiguous per driver. A driver creates record ``s + 1`` over its own last
record ``s`` and nothing else, except when it starts: then it **claims** the job by
creating a claim record above the highest record it lists (carrying the retained set
over; "Pipelined records" below). So the record after any driver's last one is either
its own next commit or another driver's claim, and claim records are never deleted (one small
object per driver start; :attr:`Head.claims` lists them): a driver that was taken over
finds its next record taken at its next commit, is fenced (:class:`JobFencedError`)
and never writes or deletes through this store again. The newest driver wins (a
restarted driver must be able to take over from a dead one). A create that finds the
record there already compares it with what it wrote: the same bytes are its own
retried write; anything else fences it (a sequence number whose create failed is
never used again, so no other bytes of its own can be there). Only stores with a conditional
create fence reliably (local POSIX, S3, memory); on others two simultaneous claims may
both succeed.

Pipelined records: a driver creates up to ``MAX_RECORDS_IN_FLIGHT`` records at once
(sequence numbers reserved in completion order, :meth:`CheckpointStore.reserve`); each
carries the metadata of the checkpoints of the records before it still in flight, so
it stands alone if they fail, and the coordinator confirms them in order. A claim
leaves ``CLAIM_GAP`` sequence numbers free: a driver that claims at ``c`` writes its
first record at ``c + CLAIM_GAP``, and claims at ``max(highest + 1, newest claim +
CLAIM_GAP)`` (so it also collides with the first record of a driver that has just
claimed). A driver taken over loses the create that collides with the claim and
confirms nothing after it; its other records in flight (strays) land within the gap
above the claim, since a driver reserves at most ``MAX_RECORDS_IN_FLIGHT`` beyond its
newest created record. Readers skip them: the head is the newest record with no
other driver's claim among the ``CLAIM_GAP - 1`` sequence numbers below it (above its
writer's own claim); the sweeps delete them.

Older layouts stay readable: ``chk-<id>.json`` metadata with ``LATEST-<n>`` pointer
versions (and the single ``LATEST`` of before) are read while no commit record exists;
the first claim then carries their retained set into record 1 (entries naming no
record: ``[id, null]``, read from ``chk-<id>.json``) and also creates the next pointer
version, so a driver of the old layout still running on the job is fenced by its own
rule. Once a commit record exists the old pointers and the old metadata no retained
checkpoint needs are stale files.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.compact import pack, unpack
from dstltree.coordinator.errors import CoordinatorError, CorruptCheckpointError
from dstltree.coordinator.hedged_create import HedgedCreate
from dstltree.coordinator.splitlog import decode_split_log
from dstltree.storage.errors import StorageError
from dstltree.storage.store import CHECKPOINT_DIR, ObjectExistsError, ObjectStore

log = logging.getLogger(__name__)
#: Format version of commit records.
RECORD_VERSION = 4
#: Format versions of commit records this code reads: 3 kept a multipart sink
#: committable a dict, 4 writes it as a row (coordinator/compact.py).
READ_VERSIONS = (3, 4)
LATEST_NAME = "LATEST"
_RECORD = re.compile(r"/commit-(\d{10,})\.json$")
_POINTER = re.compile(r"/LATEST-(\d{10,})$")
_CLAIM_ATTEMPTS = 5
_READ_ATTEMPTS = 3
#: Sequence numbers between a claim and the claimer's first checkpoint record: the
#: records of the driver it took over that were in flight at the claim land there
#: (module docstring, "Pipelined records").
CLAIM_GAP = 8
#: Most commit records a driver has in flight beyond its newest created one (fewer
#: than the gap).
MAX_RECORDS_IN_FLIGHT = 4


class JobFencedError(CoordinatorError):
    """Another driver took over this job (its record at ``path``): this driver must
    stop; it writes and deletes nothing more."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"fenced: another driver runs this job ({path}: {reason})")
        self.path = path


@dataclass(frozen=True)
class Head:
    """The newest commit record (or the old layout's newest pointer): ``seq`` None
    when there is no record; ``retained``: (checkpoint id, record seq or None for an
    old ``chk-<id>.json``), ascending ids; ``claims``: sequence numbers of every claim
    record; ``pointer``: the highest old ``LATEST-<n>`` version present (None: none);
    ``highest``: the highest record present, a fenced driver's stray included."""

    seq: int | None = None
    retained: tuple[tuple[int, int | None], ...] = ()
    claims: tuple[int, ...] = ()
    pointer: int | None = None
    highest: int | None = None  # the highest record present (a stray included)

    @property
    def latest_id(self) -> int | None:
        return self.retained[-1][0] if self.retained else None


@dataclass(frozen=True)
class Committed:
    """What :meth:`CheckpointStore.commit` did: ``path`` and ``seq`` of the record that
    is the commit point, ``requests`` on the completion path (1 when the first create
    succeeds), ``metadata_bytes``: checkpoint id -> bytes of its metadata in the record
    (0 for a checkpoint completed but subsumed at once)."""

    path: str
    seq: int
    requests: int
    metadata_bytes: dict[int, int] = field(default_factory=dict)


class CheckpointStore:
    """Reads and writes completed checkpoints through ``store`` (the only DFS access).

    ``owner``: this driver's token, written into every record (default: a random one).
    Methods raise :class:`dstltree.storage.errors.StorageError` for storage failures,
    :class:`dstltree.coordinator.errors.CorruptCheckpointError` (naming the file) for
    files that cannot be decoded or name a format version this code does not know, and
    writes and deletions :class:`JobFencedError` once another driver claimed the job.
    Thread-safe: commits and deletions may run on different threads.
    """

    def __init__(self, store: ObjectStore, owner: str | None = None) -> None:
        self.store = store
        self.root = store.join(CHECKPOINT_DIR)
        self.owner = owner or uuid.uuid4().hex
        self.seq: int | None = None  # the newest record this store created
        self._claim: int | None = None  # this store's claim record
        self._next: int | None = None  # the next sequence number to reserve
        self._mine: set[int] = set()  # sequence numbers reserved since the claim
        self.fenced: JobFencedError | None = None
        self.pointers_deleted = 0  # records and old pointer versions deleted
        self._lock = threading.Lock()
        self._where: dict[int, int | None] = {}  # retained id -> record seq (None: old file)
        self._placed: dict[int, set[int | None]] = {}  # id -> records that may hold it
        self._claims: tuple[int, ...] = ()
        self._records: dict[int, dict[str, Any]] = {}  # decoded records (immutable), by seq
        self._hedged = HedgedCreate()

    # -- paths -------------------------------------------------------------------------
    def record_path(self, seq: int) -> str:
        """URL of commit record ``seq``."""
        return self.store.join(CHECKPOINT_DIR, f"commit-{seq:010d}.json")

    def metadata_path(self, checkpoint_id: int) -> str:
        """URL of an old layout's metadata file of ``checkpoint_id``."""
        return self.store.join(CHECKPOINT_DIR, f"chk-{checkpoint_id:010d}.json")

    def pointer_path(self, version: int) -> str:
        """URL of old pointer version ``version`` (0: the single ``LATEST`` file)."""
        name = LATEST_NAME if version == 0 else f"{LATEST_NAME}-{version:010d}"
        return self.store.join(CHECKPOINT_DIR, name)

    @property
    def version(self) -> int | None:
        """The record this store created last (None before its claim)."""
        return self.seq

    def _listing(self) -> tuple[list[int], list[int]]:
        """(record seqs, old pointer versions) present, ascending."""
        seqs, versions = [], []
        legacy = self.pointer_path(0)
        for url in self.store.list_files(self.root):
            m = _RECORD.search(url)
            if m:
                seqs.append(int(m.group(1)))
                continue
            m = _POINTER.search(url)
            if m:
                versions.append(int(m.group(1)))
            elif url == legacy:
                versions.append(0)
        return sorted(seqs), sorted(versions)

    # -- reads -------------------------------------------------------------------------
    def head(self) -> Head:
        """The newest record, or the old layout's newest pointer (one listing, one
        read). Raises StorageError, CorruptCheckpointError."""
        for attempt in range(_READ_ATTEMPTS):
            seqs, versions = self._listing()
            pointer = versions[-1] if versions else None
            if not seqs and pointer is None:
                return Head()
            path = self.record_path(seqs[-1]) if seqs else self.pointer_path(pointer or 0)
            try:
                if seqs:
                    return _head_of(self._newest_valid(seqs), pointer, seqs[-1])
                _, retained = _decode_pointer(path, self.store.read(path))
                return Head(None, tuple((i, None) for i in retained), (), pointer)
            except StorageError:
                # deleted after the listing (an old layout's pointer): list again
                if attempt + 1 == _READ_ATTEMPTS or self.store.exists(path):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _newest_valid(self, seqs: list[int]) -> dict[str, Any]:
        """The newest record that is not a stray. A checkpoint record ``h`` is a stray
        when another driver's claim lies in ``(h - CLAIM_GAP, h)`` above the claim of
        ``h``'s writer: that driver was taken over while ``h`` was in flight. Reads the
        records present in that window (few: subsumed records are deleted; records are
        cached). Raises StorageError, CorruptCheckpointError."""
        present = set(seqs)
        for h in reversed(seqs):
            record = self._record(h)
            if record["kind"] == "claim":
                return record
            own = max((int(c) for c in record["claims"]), default=0)
            window = range(max(own + 1, h - CLAIM_GAP + 1), h)
            if not any(self._foreign_claim(s, record["owner"]) for s in window if s in present):
                return record
        raise CorruptCheckpointError(self.root, "every commit record is a fenced driver's")

    def _foreign_claim(self, seq: int, owner: str) -> bool:
        """Record ``seq`` is another driver's claim (False when it vanished)."""
        try:
            record = self._record(seq)
        except StorageError:
            return False
        return bool(record["kind"] == "claim" and record["owner"] != owner)

    def _record(self, seq: int) -> dict[str, Any]:
        """Commit record ``seq``, decoded and checked (cached: records never change)."""
        cached = self._records.get(seq)
        if cached is not None:
            return cached
        path = self.record_path(seq)
        record = _decode_record(path, self.store.read(path), seq)
        if len(self._records) > 64:
            self._records.clear()
        self._records[seq] = record
        return record

    def latest_id(self) -> int | None:
        """Id of the latest completed checkpoint, or None if there is none."""
        return self.head().latest_id

    def retained_ids(self) -> list[int]:
        """Ids of the retained checkpoints, ascending."""
        return [i for i, _ in self.head().retained]

    def load(self, checkpoint_id: int, head: Head | None = None) -> CompletedCheckpoint:
        """Read one retained checkpoint's metadata (``head``: from :meth:`head`, read
        when not given). Raises CorruptCheckpointError naming the file, StorageError
        (also for an id no retained checkpoint has)."""
        where = dict((self.head() if head is None else head).retained)
        if checkpoint_id not in where:
            raise StorageError("read", self.root, f"checkpoint {checkpoint_id} is not retained")
        seq = where[checkpoint_id]
        if seq is None:
            return self._load_old(checkpoint_id)
        path = self.record_path(seq)
        for d in self._record(seq)["checkpoints"]:
            if isinstance(d, dict) and d.get("checkpoint_id") == checkpoint_id:
                try:
                    full = unpack(d, self.store.base_url)
                except (KeyError, IndexError, TypeError, ValueError) as e:
                    raise CorruptCheckpointError(path, f"bad checkpoint metadata: {e!r}") from e
                return self._with_split_log(_checkpoint_of(path, full, checkpoint_id))
        raise CorruptCheckpointError(path, f"does not hold checkpoint {checkpoint_id}")

    def _with_split_log(self, cp: CompletedCheckpoint) -> CompletedCheckpoint:
        """``cp`` with the ids of the split log it references read in
        (coordinator/splitlog.py). Raises CorruptCheckpointError, StorageError."""
        ref = cp.finished_log
        if ref is None or ref.ids is not None:
            return cp
        return cp.resolved(decode_split_log(ref.path, self.store.read(ref.path), ref.count))

    def _load_old(self, checkpoint_id: int) -> CompletedCheckpoint:
        path = self.metadata_path(checkpoint_id)
        try:
            d = json.loads(self.store.read(path))
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(path, f"bad checkpoint metadata: {e}") from e
        return _checkpoint_of(path, d, checkpoint_id)

    def load_latest(self) -> CompletedCheckpoint | None:
        """The latest completed checkpoint (for restore), or None."""
        h = self.head()
        return None if h.latest_id is None else self.load(h.latest_id, h)

    def list_retained(self) -> list[CompletedCheckpoint]:
        """Every retained checkpoint, oldest first."""
        h = self.head()
        return [self.load(i, h) for i, _ in h.retained]

    # -- fencing -----------------------------------------------------------------------
    def claim(self) -> int:
        """Take the job over: create a claim record after the highest record, carrying
        its retained set (and, on an old layout, the next pointer version too).
        Returns the record's seq. Raises JobFencedError if other drivers keep claiming
        in between (5 tries), StorageError."""
        new = 1
        for _ in range(_CLAIM_ATTEMPTS):
            h = self.head()
            # above every record, and at the first record of the newest claimer (it
            # collides with that driver's next create when none of its records landed)
            new = max((h.highest or 0) + 1, max(h.claims, default=-CLAIM_GAP) + CLAIM_GAP)
            claims = (*h.claims, new)
            body = self._body("claim", new, h.retained, claims, [])
            if not self._create(self.record_path(new), body):
                continue
            if h.seq is None and h.pointer is not None:
                self._fence_old_layout(h)
            with self._lock:
                self.seq, self.fenced, self._claims = new, None, claims
                self._claim, self._next, self._mine = new, new + CLAIM_GAP, set()
                self._where = dict(h.retained)
                for i, s in self._where.items():
                    self._placed.setdefault(i, set()).add(s)
            return new
        raise self._fence(self.record_path(new), "other drivers keep claiming the job")

    def _fence_old_layout(self, h: Head) -> None:
        """Create the old layout's next pointer version (its drivers fence themselves
        at their next pointer write on seeing it)."""
        assert h.pointer is not None
        ids = [i for i, _ in h.retained]
        body = {"latest": ids[-1] if ids else None, "retained": ids, "owner": self.owner}
        data = json.dumps(body, separators=(",", ":")).encode()
        self._create(self.pointer_path(h.pointer + 1), data)

    def verify_owner(self) -> None:
        """Raise JobFencedError if another driver claimed the job since this store's
        last record (one listing, and a read when a newer record is there: it may be
        this driver's own create under way; no-op before its claim). Raises
        StorageError."""
        self._check_not_fenced()
        claim = self._claim
        if claim is None:
            return
        seqs, _ = self._listing()
        with self._lock:
            mine = set(self._mine)
        # Records above this driver's claim it did not reserve: another driver's claim
        # or records (fenced), or strays of the driver it took over (checkpoint records
        # within the gap above its claim).
        for seq in (s for s in seqs if s > claim and s not in mine):
            if seq >= claim + CLAIM_GAP or self._foreign_claim(seq, self.owner):
                raise self._fence(self.record_path(seq), "a newer commit record")

    def _fence(self, path: str, reason: str) -> JobFencedError:
        self.fenced = JobFencedError(path, reason)
        return self.fenced

    def _check_not_fenced(self) -> None:
        if self.fenced is not None:
            raise self.fenced

    def _body(
        self,
        kind: str,
        seq: int,
        retained: Sequence[tuple[int, int | None]],
        claims: Sequence[int],
        checkpoints: Sequence[dict[str, Any]],
    ) -> bytes:
        body = {
            "version": RECORD_VERSION,
            "seq": seq,
            "kind": kind,
            "owner": self.owner,
            "retained": [list(p) for p in retained],
            "claims": list(claims),
            "checkpoints": list(checkpoints),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    def _create(self, url: str, data: bytes) -> bool:
        """Create ``url`` exclusively; False if it exists and is not these bytes (a
        retried create whose first attempt landed is True)."""
        try:
            self.store.put(url, data, exclusive=True)
            return True
        except ObjectExistsError:
            try:
                return self.store.read(url) == data
            except StorageError:
                return False

    # -- writes ------------------------------------------------------------------------
    def reserve(self) -> int:
        """The sequence number of the next commit record (claims the job first if this
        store has not). Reserve in the order the records complete checkpoints; the
        records are then created concurrently (pipelined). At most
        ``MAX_RECORDS_IN_FLIGHT`` beyond the newest record created (so that a driver
        taken over has its strays within the gap above the claim that fenced it):
        the caller keeps fewer in flight; when failed creates used them up, the store
        claims the job again. Raises JobFencedError, StorageError."""
        self._check_not_fenced()
        if self._claim is None:
            self.claim()
        if self._next_beyond_bound():
            # creates failed MAX_RECORDS_IN_FLIGHT times in a row: claim again under a
            # new owner token, so that any of them landing late is a stray of another
            # driver's for readers (one listing, one read, one create)
            log.warning(
                "commit records failed %d times in a row: claiming again", MAX_RECORDS_IN_FLIGHT
            )
            self.owner = uuid.uuid4().hex
            self.claim()
        with self._lock:
            assert self._next is not None
            seq, self._next = self._next, self._next + 1
            self._mine.add(seq)
        return seq

    def _next_beyond_bound(self) -> bool:
        """The next sequence number is ``MAX_RECORDS_IN_FLIGHT`` or more beyond the
        newest record created (or the first one after the claim)."""
        with self._lock:
            assert self._next is not None and self._claim is not None
            base = max(self.seq or 0, self._claim + CLAIM_GAP - 1)
            return self._next > base + MAX_RECORDS_IN_FLIGHT

    def commit(
        self,
        checkpoints: Sequence[CompletedCheckpoint],
        retained: Sequence[int],
        seq: int | None = None,
    ) -> Committed:
        """Complete ``checkpoints`` (ascending ids, newer than every checkpoint
        completed before) with one record, the commit point, at ``seq`` (from
        :meth:`reserve`; None: reserve now). ``retained``: the ids retained afterwards
        (the newest of ``checkpoints`` among them; the others completed before, or in
        ``checkpoints``); only the metadata of retained ones is written. A record
        created while earlier ones are in flight must carry their checkpoints, so that
        it stands alone when they fail. A sequence number is used once: a create that
        failed burns it. Returns :class:`Committed`. Raises JobFencedError,
        StorageError (nothing committed), ValueError for a retained id this store does
        not know."""
        seq = self.reserve() if seq is None else seq
        self._check_not_fenced()
        batch = {c.checkpoint_id: c for c in checkpoints}
        keep = sorted(set(retained))
        if not batch or max(batch) not in keep:
            raise ValueError("the newest checkpoint of a commit must be retained")
        with self._lock:
            older = [i for i in keep if i not in batch]
            unknown = [i for i in older if i not in self._where]
            where = {i: self._where.get(i) for i in older}
            claims = self._claims
        if unknown:
            raise ValueError(f"retained checkpoints {unknown} are not known to this store")
        base = self.store.base_url
        dicts = {i: pack(batch[i].to_dict(), base) for i in keep if i in batch}
        sizes = {
            i: len(json.dumps(dicts[i], separators=(",", ":"))) if i in dicts else 0 for i in batch
        }
        pairs = [(i, seq if i in batch else where[i]) for i in keep]
        body = self._body("checkpoint", seq, pairs, claims, [dicts[i] for i in sorted(dicts)])
        path = self.record_path(seq)
        created, requests = self._hedged.run(partial(self._put_new, path, body))
        if not created:
            requests += 1
            if self._read_quietly(path) != body:  # our own landed create reads the same
                raise self._fence(path, "this commit record exists")
        with self._lock:
            for i in batch:
                self._placed.setdefault(i, set()).add(seq)
            if self.seq is None or seq > self.seq:
                self.seq = seq
                self._where = dict(pairs)
        return Committed(path, seq, requests, sizes)

    def _put_new(self, url: str, data: bytes) -> None:
        self.store.put(url, data, exclusive=True)

    def _read_quietly(self, url: str) -> bytes | None:
        try:
            return self.store.read(url)
        except StorageError:
            return None

    def add(self, checkpoint: CompletedCheckpoint, retained: Sequence[int] | None = None) -> str:
        """Commit one checkpoint (:meth:`commit`); ``retained``: ids of the older
        checkpoints that stay retained (None: every currently retained one). Returns
        the record's URL."""
        self._check_not_fenced()
        if self.seq is None:
            self.claim()
        with self._lock:
            older = sorted(self._where) if retained is None else list(retained)
        ids = {i for i in older if i < checkpoint.checkpoint_id} | {checkpoint.checkpoint_id}
        return self.commit([checkpoint], sorted(ids)).path

    def delete(self, checkpoint_id: int) -> list[str]:
        """Delete what holds ``checkpoint_id``'s metadata once no retained checkpoint
        needs it: its record (never a claim or this store's newest record), or an old
        layout's ``chk-<id>.json``. A checkpoint still retained, or one this store did
        not commit or take over, deletes nothing. Returns the URLs deleted. Raises
        JobFencedError (nothing deleted then), StorageError."""
        self._check_not_fenced()
        with self._lock:
            if checkpoint_id in self._where or checkpoint_id not in self._placed:
                return []
            held = self._placed.pop(checkpoint_id)
            needed = {*self._where.values(), *self._claims, self.seq}
            needed |= {s for ss in self._placed.values() for s in ss}  # other checkpoints
        doomed = [
            self.metadata_path(checkpoint_id) if s is None else self.record_path(s)
            for s in sorted(held, key=lambda s: -1 if s is None else s)
            if s not in needed
        ]
        if not doomed:
            return []
        deleted = self.store.delete(doomed)
        with self._lock:
            self.pointers_deleted += len(deleted)
        return deleted

    def stale_files(self, cutoff: float | None = None) -> list[str]:
        """Files under ``checkpoints/`` nothing needs: records that are not the newest,
        not a claim and hold no retained checkpoint; old metadata files no retained
        checkpoint is in; old pointer versions but the highest; leftover temporary
        files. With ``cutoff`` (epoch seconds, the store's clock) only those modified
        before it (a write under way, another driver's claim included, is younger)."""
        h = self.head()
        keep = {self.record_path(s) for s in h.claims}
        if h.seq is not None:
            keep.add(self.record_path(h.seq))
        for i, s in h.retained:
            keep.add(self.metadata_path(i) if s is None else self.record_path(s))
        if h.pointer is not None:
            keep.add(self.pointer_path(h.pointer))
        return [
            i.url
            for i in self.store.list_info(self.root)
            if i.url not in keep and (cutoff is None or (i.mtime is not None and i.mtime < cutoff))
        ]


def _head_of(record: dict[str, Any], pointer: int | None, highest: int) -> Head:
    retained = tuple((int(i), None if s is None else int(s)) for i, s in record["retained"])
    claims = tuple(int(c) for c in record["claims"])
    return Head(int(record["seq"]), retained, claims, pointer, highest)


def _decode_record(path: str, raw: bytes, seq: int) -> dict[str, Any]:
    """A commit record, checked: its format version, its seq, the retained list
    (ascending, naming records at or below it) and the metadata it holds. Raises
    CorruptCheckpointError naming the file (and an unknown version)."""
    try:
        d: Any = json.loads(raw)
        version = d.get("version") if isinstance(d, dict) else None
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(path, f"bad commit record: {e}") from e
    if version not in READ_VERSIONS:
        known = ", ".join(map(str, READ_VERSIONS))
        raise CorruptCheckpointError(
            path, f"commit record format version {version!r} is not known (this reads {known})"
        )
    try:
        ok = (
            int(d["seq"]) == seq
            and d["kind"] in ("checkpoint", "claim")
            and isinstance(d["owner"], str)
            and isinstance(d["checkpoints"], list)
        )
        ids = [int(i) for i, _ in d["retained"]]
        seqs = [None if s is None else int(s) for _, s in d["retained"]]
        claims = [int(c) for c in d["claims"]]
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptCheckpointError(path, f"bad commit record: {e!r}") from e
    if not ok:
        raise CorruptCheckpointError(path, f"not commit record {seq}")
    if ids != sorted(set(ids)) or any(s is not None and not 0 < s <= seq for s in seqs):
        raise CorruptCheckpointError(path, "retained checkpoints out of order or ahead")
    if any(not 0 < c <= seq for c in claims):
        raise CorruptCheckpointError(path, "a claim record ahead of this one")
    return dict(d)


def _checkpoint_of(path: str, d: Any, checkpoint_id: int) -> CompletedCheckpoint:
    try:
        cp = CompletedCheckpoint.from_dict(d)
    except Exception as e:  # noqa: BLE001 - any decode failure is corruption
        raise CorruptCheckpointError(path, f"bad checkpoint metadata: {e}") from e
    if cp.checkpoint_id != checkpoint_id:
        raise CorruptCheckpointError(path, f"holds checkpoint {cp.checkpoint_id}")
    return cp


def _decode_pointer(path: str, raw: bytes) -> tuple[int | None, list[int]]:
    """(latest, retained) of an old layout's pointer file. Raises CorruptCheckpointError."""
    try:
        d: Any = json.loads(raw)
        latest = None if d["latest"] is None else int(d["latest"])
        retained = sorted({int(i) for i in d["retained"]})
    except Exception as e:  # noqa: BLE001 - any decode failure is corruption
        raise CorruptCheckpointError(path, f"bad pointer: {e}") from e
    newest = retained[-1] if retained else None
    if latest != newest:
        raise CorruptCheckpointError(path, f"latest {latest} is not the newest of {retained}")
    return latest, retained
