"""The tree side of the bridge: state files written as segments through one
:class:`~dstltree.client.api.ChangelogClient`, read back by range reads, views rebuilt
from manifests and object indexes, manifests written and released objects deleted off
the critical path. The pure bookkeeping is :class:`~.view.View`; this module does the
I/O and the locking around it (one condition variable for the view).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from dstltree.client.api import ChangelogClient
from dstltree.client.batching import FlushGroup, PersistItem
from dstltree.client.errors import CorruptObjectError
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.reader import read_index, read_segment
from dstltree.client.wire import BROADCAST, Note
from dstltree.client.writer import ChangelogWriter
from dstltree.storage.errors import DstlError
from dstltree.structured_streaming import crosshost, paths
from dstltree.structured_streaming.crosshost import CrossHost, Remote, dump_body, load_body
from dstltree.structured_streaming.ledger import Ledger
from dstltree.structured_streaming.view import (
    DATA_KEY_GROUP,
    KEY_GROUPS,
    MAX_LOG_ID,
    TOMBSTONE_KEY_GROUP,
    DeleteObject,
    Entry,
    Instruction,
    ReadIndex,
    View,
    log_id,
    manifest_from_store,
    manifest_to_store,
    parse_log_id,
    query_key,
)
from dstltree.structured_streaming.wire import WireError

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

CHUNK = 1024 * 1024  # bytes per change
NEVER_PREEMPT = 1 << 62  # a write is one segment: no pre-emptive upload inside it
RESCAN_MARGIN = 60.0  # s: objects this much older than the manifest are read again
MANIFESTS_KEPT = 2
MAX_HOLD = 300.0  # s a root's held writes wait for its commit once no new one came:
# a first batch at 200 partitions on the S3 model runs over 5 minutes (RocksDB instances
# start, files are probed at S3 latencies), writing as its tasks end; a held write costs
# only memory (max_held_bytes bounds it)
COMMITTER_TTL = 3600.0  # s after its last commit an application is forgotten
_VERSION = re.compile(r"^(\d{1,18})(?:_[^./]+)?\.(?:changelog|delta|snapshot|zip)$")
# manifest-<seq>.json (format 1, one bridge) or manifest-<bridge id>-<seq>.json
HOLD_RETRY = 30.0  # s after an unanswered hold before a bridge asks again
FLUSH_WAIT = 100.0  # s a holder waits for its flushed files to become durable
_MANIFEST = re.compile(r"/manifest-(?:([A-Za-z0-9._-]{1,64})-)?(\d{1,18})\.json$")
MANIFEST_BATCHES = 3  # a root's manifest is written at most once per this many batches
MANIFEST_MAX_WAIT = 30.0  # s: ... and at least this often while it changes
REFRESH_INTERVAL = 1.0  # s between refreshes of a root on a miss, at least
READERS = 16  # objects' indexes (and rebuilt files) read at a time by a rebuild or refresh
SWEEP_INTERVAL = 60.0  # s between orphan sweeps, at least (and one when the bridge stops)
SWEEP_MIN_AGE = 10.0  # s: younger objects wait for the next sweep (a copy may be on its way)
IDLE_QUIET = 2.0  # s without a new held write before a root between batches is flushed
SHARED_ORPHAN_AGE = 3600.0  # s: a row of a root other bridges write that no version names
# is dead once its object is this old (their manifests, every few seconds, name it by then)


def manifest_name(url: str) -> tuple[str, int] | None:
    """(bridge id, seq) of a manifest's URL ("" for format 1's name), None otherwise."""
    m = _MANIFEST.search(url)
    return None if m is None else (m.group(1) or "", int(m.group(2)))


def manifest_due(last: float | None, batches: list[float], now: float) -> bool:
    """Whether a root's manifest, last written at ``last`` (None: never), may be written
    at ``now`` given when its recent batches ended (``batches``, seconds, oldest first):
    once MANIFEST_BATCHES mean batch intervals passed, or MANIFEST_MAX_WAIT s; at once
    while fewer than two batches tell no interval (a new query's first files)."""
    if last is None or len(batches) < 2:
        return True
    gap = (batches[-1] - batches[0]) / (len(batches) - 1)
    return now - last >= min(MANIFEST_MAX_WAIT, MANIFEST_BATCHES * gap)


def idle_flush_due(in_batch: bool, newest: float | None, now: float) -> bool:
    """Whether a committer's held writes of a root are persisted without a commit: no
    batch of the root is running (its driver committed and announced no next one;
    ``in_batch``) and no write was held for IDLE_QUIET s since ``newest`` (seconds,
    None: nothing held). They are what Spark's state maintenance writes between
    batches or after a query stopped (snapshots and their SST files), which no commit
    may follow: one object for all of them, not one per file or a wait of MAX_HOLD."""
    return not in_batch and newest is not None and now - newest >= IDLE_QUIET


def checkpoint_id(path: str) -> int:
    """The state version named by a file (``12.changelog``, ``12_<uuid>.zip``, ...),
    0 for names without one (SST files)."""
    m = _VERSION.match(path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else 0


@dataclass
class _Flush:
    """A flush of a root's held writes under way: the writes it waits for ((path,
    SQN) pairs, not durable when it started) and its holders' flushes (cids)."""

    targets: set[tuple[str, int]]
    cids: list[str]


@dataclass(frozen=True)
class _Held:
    """A write accepted and held until its root's commit: its persist's arguments and
    when it was held (monotonic seconds)."""

    path: str
    sqn: int
    kg: int
    chunks: list[bytes]
    size: int
    since: float


class TreeFiles:
    """State files of many query roots in the tree. Thread-safe.

    ``max_pending_bytes``: bytes of accepted files not yet durable beyond which
    :meth:`reserve` blocks. ``cache_bytes``: durable files' bytes kept for reads.
    ``max_held_bytes``: bytes of writes held for a commit beyond which they are
    persisted at once; ``max_hold``: seconds a write is held at most (the
    housekeeper persists older ones). ``bridge_id``: this bridge's name among the
    bridges of other hosts that serve the same queries (it names its manifests and
    entries; ``[A-Za-z0-9._-]``, at most 64 characters, "" for a lone bridge).

    Writes of an application that has committed the root on this bridge (the driver's
    host) are held and persisted together when the next commit of the root arrives:
    one persist per batch, so the node packs a batch's files into one object. Writes
    of any other application are persisted at once and :meth:`put`'s caller waits for
    them (:meth:`wait_written`): no batch commits before they are durable, wherever
    its driver runs (docs/structured-streaming.md, "Durability").
    """

    def __init__(
        self,
        client: ChangelogClient,
        *,
        max_pending_bytes: int = 256 * 1024 * 1024,
        cache_bytes: int = 64 * 1024 * 1024,
        max_held_bytes: int = 64 * 1024 * 1024,
        max_hold: float = MAX_HOLD,
        bridge_id: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if bridge_id and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", bridge_id):
            raise ValueError(f"bridge_id: [A-Za-z0-9._-], 1..64 characters, got {bridge_id!r}")
        self.client = client
        self.store = client.store
        self.bridge_id = bridge_id
        self.boot = secrets.token_hex(8)  # this process: a restart loses held writes
        self.view = View(bridge_id)
        self.ledger = Ledger()  # what dstl status shows (under cond)
        self._missed: dict[str, float] = {}  # root -> monotonic time of the last miss refresh
        self._scanned: dict[str, float] = {}  # root -> wall time of its last index scan
        self._indexed: dict[str, set[str]] = {}  # root -> objects whose index it read
        self.cond = threading.Condition()
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0  # accepted or buffered, not yet durable
        self.in_flight_bytes = 0  # accepted, not yet durable
        self._clock = clock
        self._load_lock = threading.Lock()
        self._ready: set[str] = set()  # roots loaded
        self._cache: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._cache_bytes, self._cache_max = 0, cache_bytes
        self._todo: deque[Instruction] = deque()
        self._next_sweep = 0.0  # monotonic
        self._foreign: dict[str, frozenset[str]] = {}  # object -> query keys ("": not ss)
        self.max_held_bytes, self.max_hold = max_held_bytes, max_hold
        self._held: dict[str, list[_Held]] = {}  # by root
        self._held_bytes = 0
        self._committers: dict[tuple[str, str], float] = {}  # (root, app) -> last commit
        self._in_batch: dict[str, str] = {}  # root -> app: a batch announced, not committed
        self._idle: dict[str, _Flush] = {}  # root -> an idle flush its next commit sees end
        self._hold_notes: dict[str, float] = {}  # root -> monotonic time of the last hold note
        self.crosshost = CrossHost(bridge_id or "bridge")  # commits across hosts
        # root -> (the committer asked, its answer): a hold note on its way
        self._announcing: dict[str, tuple[str, threading.Event]] = {}
        self._notes = self._subscribe()
        self._note_pool: ThreadPoolExecutor | None = None
        self._unanswered: dict[str, float] = {}  # root -> monotonic time of a hold unanswered
        self._manifested: dict[str, float] = {}  # root -> monotonic time of its manifest
        self._batches: dict[str, deque[float]] = {}  # root -> monotonic commit/flush times
        self.counts: dict[str, int] = dict.fromkeys(
            (
                "puts", "deletes", "durable", "failed", "manifests", "objects_deleted",
                "held", "flushes", "orphans_deleted", "remote_flushes", "notes_refused",
                "idle_flushes",
            ),
            0,
        )  # fmt: skip

    # -- roots -------------------------------------------------------------------------
    def manifest_dir(self, root: str) -> str:
        return self.store.join("ss", query_key(root))

    def ensure(self, root: str) -> None:
        """Load ``root``'s view (newest manifest plus newer objects' indexes) unless
        known. Raises WireError(``unavailable``) when the store cannot be read."""
        if root in self._ready:
            return
        with self._load_lock:
            if root in self._ready:
                return
            try:
                self._scanned[root] = self._clock()
                manifests, since = self._newest_manifests(root)
                refs = self._indexes_since(since)
                with self.cond:  # a manifest of an unknown format: ValueError
                    self._todo.extend(self.view.on_loaded(root, manifests, refs))
            except (DstlError, OSError, ValueError) as e:
                raise WireError("unavailable", f"cannot rebuild {root}: {e}") from e
            self._forget_gone(root)
            self._fill_lengths(root)
            self._first_manifest(root)
            self._ready.add(root)  # published once lengths are known

    def _first_manifest(self, root: str) -> None:
        """Write this bridge's first manifest of ``root`` before it accepts a write: the
        oldest of the bridges' newest manifests bounds which objects a rebuild reads,
        so a bridge that dies before its next manifest still has its objects read."""
        if not self.bridge_id or (root, self.bridge_id) in self.view.merged:
            return
        with self.cond:
            self.view.roots[root].dirty = True
            doc = self.view.manifest(root)
        if doc is not None:
            self._write_manifest(root, doc)

    def _forget_gone(self, root: str) -> None:
        """Objects a loaded manifest's tombstones wait for that were deleted since (by
        this bridge before a restart, or by the bridge that wrote them)."""
        rv = self.view.root(root)
        assert rv is not None
        with self.cond:
            tracked = set(self.view.objects)
            urls = {u for e in list(rv.files.values()) if e.deleted for u in e.older}
        urls = {u for u in urls if u not in tracked or root not in self._ready}
        gone = [u for u in urls if not self.store.exists(u)]
        with self.cond:
            for u in gone:
                self._todo.extend(self.view.on_object_deleted(u))

    def _newest_infos(self, root: str) -> dict[str, tuple[int, Any]]:
        """The newest manifest of every bridge of ``root``: bridge id -> (seq, info)."""
        newest: dict[str, tuple[int, Any]] = {}
        for info in self.store.list_info(self.manifest_dir(root)):
            named = manifest_name(info.url)
            if named is not None and named[1] > newest.get(named[0], (-1, None))[0]:
                newest[named[0]] = (named[1], info)
        return newest

    def _newest_manifests(self, root: str) -> tuple[list[dict[str, Any]], float | None]:
        """The newest manifest of every bridge of ``root`` and the oldest one's
        modification time (None: no manifest)."""
        newest = self._newest_infos(root)
        docs = [self._read_manifest(info.url) for _, info in newest.values()]
        since = min((info.mtime for _, info in newest.values()), default=None)
        return docs, since

    def _read_manifest(self, url: str) -> dict[str, Any]:
        """A manifest read back, its objects' URLs absolute (view module). Raises
        DstlError, ValueError (not JSON, or a name outside the base)."""
        return manifest_from_store(json.loads(self.store.read(url)), self.store.base_url, url)

    def refresh(self, root: str) -> int:
        """Take in the other bridges' manifests of ``root`` newer than those taken (one
        listing, a read per newer manifest); the number read. Tombstones of this view
        waiting for objects another bridge deleted are pruned. Storage errors and
        malformed manifests are logged."""
        try:
            newest = self._newest_infos(root)
            with self.cond:
                taken = dict(self.view.merged)
            docs = [
                self._read_manifest(info.url)
                for bridge, (seq, info) in newest.items()
                if bridge not in (self.bridge_id, "") and seq > taken.get((root, bridge), -1)
            ]
            with self.cond:
                self._todo.extend(self.view.on_merge(root, docs))
            self._forget_gone(root)
        except (DstlError, OSError, ValueError) as e:
            log.warning("refresh of %s failed: %s", root, e)
            return 0
        return len(docs)

    def _refresh_on_miss(self, root: str) -> bool:
        """Refresh ``root`` (another host's bridge may have written the file missed:
        its newer manifests, then the indexes of objects written since the last scan,
        which hold files not yet in any manifest) unless it was refreshed less than
        REFRESH_INTERVAL ago; whether it was."""
        if time.monotonic() - self._missed.get(root, 0.0) < REFRESH_INTERVAL:
            return False
        self._missed[root] = time.monotonic()
        self.refresh(root)
        started = self._clock()
        try:
            with self._load_lock:
                seen = self._indexed.setdefault(root, set())
                refs = self._indexes_since(self._scanned.get(root, started), seen)
        except (DstlError, OSError) as e:
            log.warning("index scan of %s failed: %s", root, e)
            return True
        self._scanned[root] = started
        with self.cond:
            self.view.on_found(root, refs)
        self._fill_lengths(root)
        return True

    def _indexes_since(self, since: float | None, seen: set[str] | None = None) -> list[SegmentRef]:
        """Index rows of every object modified after ``since - RESCAN_MARGIN`` (all
        when None) and not in ``seen`` (the URLs read are added to it); unreadable
        objects are skipped (logged)."""
        todo: list[str] = []
        for info in self.store.list_info(self.store.changelog_root()):
            if not info.url.endswith(".dstl") or info.size == 0:
                continue
            if since is not None and info.mtime is not None and info.mtime < since - RESCAN_MARGIN:
                continue
            if seen is not None:
                if info.url in seen:
                    continue
                seen.add(info.url)
            todo.append(info.url)
        out: list[SegmentRef] = []
        for refs in _concurrently(self._index_or_none, todo):
            out += refs
        return out

    def _index_or_none(self, url: str) -> list[SegmentRef]:
        """The index rows of object ``url``; none when it is unreadable (logged)."""
        try:
            return read_index(self.store, url, verify=False)
        except (CorruptObjectError, DstlError) as e:
            log.warning("skipping object %s: %s", url, e)
            return []

    def _fill_lengths(self, root: str) -> None:
        """Lengths of files rebuilt from indexes (read once, at load, READERS at a
        time)."""
        rv = self.view.root(root)
        assert rv is not None
        todo = [(p, e) for p, e in list(rv.files.items()) if e.length < 0 and not e.deleted]

        def fill(item: tuple[str, Any]) -> None:
            path, e = item
            data = self._read_durable(root, path, e)
            with self.cond:
                self.view.set_length(root, path, e.sqn, len(data))

        list(_concurrently(fill, todo))

    # -- writes ------------------------------------------------------------------------
    def reserve(self, n: int) -> None:
        """Count ``n`` more bytes held in memory; blocks while over the limit and some
        accepted file is still to become durable (which frees bytes)."""
        while True:
            with self.cond:
                if self.pending_bytes + n <= self.max_pending_bytes:
                    self.pending_bytes += n
                    return
                if self._held_bytes == 0 and self.in_flight_bytes == 0:
                    self.pending_bytes += n  # nothing to wait for: partial puts alone
                    return
                if self._held_bytes == 0:  # wait for a persist in flight, briefly
                    self.cond.wait(timeout=1.0)
                    continue
            self.flush()  # held writes become durable, which frees bytes

    def unreserve(self, n: int) -> None:
        """Give back ``n`` bytes of a put that was abandoned."""
        with self.cond:
            self.pending_bytes -= n
            self.cond.notify_all()

    def put(self, root: str, path: str, data: bytes, app: str = "") -> tuple[int, bool]:
        """Accept a whole file (its bytes already reserved; it reads back at once) for
        application ``app``: (its SQN, whether it is held for the root's next commit).
        A write not held is being persisted: wait for it with :meth:`wait_written`.
        Raises WireError(``path``) for a path too long for a log id."""
        name = log_id(query_key(root), path)
        if len(name) > MAX_LOG_ID:
            raise WireError("path", f"path of {len(path)} characters is too long")
        self.ensure(root)
        with self.cond:
            sqn = self.view.new_sqn(int(self._clock() * 1e6))
            self.view.on_accepted(root, path, data, sqn)
            self.in_flight_bytes += len(data)
            self.counts["puts"] += 1
            self.ledger.on_write(root, path, app)
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
        held = self._write(root, app, path, sqn, DATA_KEY_GROUP, chunks, len(data))
        return sqn, held

    def put_synced(self, root: str, path: str, data: bytes, app: str, timeout: float) -> int:
        """Accept ``offsets/<N>`` (its bytes reserved; given back if refused) and
        persist it with every write of ``root`` held here as one flush (the sources'
        log entries of the batch among them), returning once all are durable; its
        SQN. Raises WireError (``unavailable``) when one failed or ``timeout`` s
        passed (paths module)."""
        try:
            self.ensure(root)
            with self.cond:
                targets = self.view.pending(root)
            sqn, _ = self.put(root, path, data, app)
        except BaseException:
            self.unreserve(len(data))
            raise
        with self.cond:
            targets |= self.view.pending(root)
        self._persist_many(self._take_held(root))
        self.wait_durable(root, timeout, targets)
        return sqn

    def delete(self, root: str, path: str, app: str = "") -> bool:
        """Delete a file (a tombstone segment is written, held for the root's commit
        like a put of ``app``); whether it existed."""
        self.ensure(root)
        with self.cond:
            sqn = self.view.new_sqn(int(self._clock() * 1e6))
            if not self.view.on_delete(root, path, sqn):
                return False
            self.counts["deletes"] += 1
        self._write(root, app, path, sqn, TOMBSTONE_KEY_GROUP, [b""], 0)
        return True

    def _write(
        self, root: str, app: str, path: str, sqn: int, kg: int, chunks: list[bytes], size: int
    ) -> bool:
        """Hold the write for the root's commit if ``app`` commits here (or on another
        host that asked for it), else persist it now; whether it was held. A write of
        ``offsets/<N>`` or ``commits/<N>`` is always held (its caller flushes next), one
        of a file the paths module calls META never (paths module)."""
        k = paths.kind(path)
        with self.cond:
            forced = k in (paths.OFFSETS, paths.COMMIT)  # flushed by the caller next
            hold = forced or (k != paths.META and (root, app) in self._committers)
            remote = None
            if not hold and k != paths.META and self._notes is not None:
                remote = self.crosshost.committer(root, app, time.monotonic())
        if remote is not None:  # the driver commits on another host: hold for it
            hold = self._announce(root, remote, checkpoint_id(path))
        with self.cond:
            if hold:
                h = _Held(path, sqn, kg, chunks, size, time.monotonic())
                self._held.setdefault(root, []).append(h)
                self._held_bytes += size
                self.counts["held"] += 1
            over = self._held_bytes > self.max_held_bytes
        if not hold:
            self._persist(root, path, sqn, kg, chunks, size)
        elif over:
            self.flush()
        return hold

    def status(self) -> dict[str, Any]:
        """The bridge's figures for the protocol's ``status`` request: ``bridge`` (its
        id), ``counts`` (as :attr:`counts`), ``bytes`` (``pending``, ``in_flight``,
        ``held``, bytes) and ``queries`` (:meth:`.ledger.Ledger.figures`)."""
        with self.cond:
            held = {r: sum(h.size for h in hs) for r, hs in self._held.items() if hs}
            return {
                "bridge": self.bridge_id,
                "counts": dict(self.counts),
                "bytes": {
                    "pending": self.pending_bytes,
                    "in_flight": self.in_flight_bytes,
                    "held": self._held_bytes,
                },
                "queries": self.ledger.figures(self._clock(), held),
            }

    @property
    def held_bytes(self) -> int:
        """Bytes of writes held for a commit (read under ``cond``)."""
        return self._held_bytes

    def flush(self, root: str | None = None, older_than: float | None = None) -> int:
        """Persist the held writes of ``root`` (None: of every root), if ``older_than``
        (seconds) is given only those of roots that held no new write for that long (a
        batch still writing is not cut in two); the number persisted. A held write
        already replaced by a newer one is dropped instead."""
        out = self._take_held(root, older_than)
        self._persist_many(out)
        return len(out)

    def _take_held(
        self, root: str | None = None, older_than: float | None = None
    ) -> list[tuple[str, _Held]]:
        """Take the held writes :meth:`flush` persists (replaced ones are dropped)."""
        now = time.monotonic()
        out: list[tuple[str, _Held]] = []
        dropped = 0
        with self.cond:
            for r in [root] if root is not None else list(self._held):
                held = self._held.get(r, [])
                if older_than is not None and held and now - held[-1].since < older_than:
                    continue  # the root still writes: its commit is on its way
                for h in self._held.pop(r, []):
                    self._held_bytes -= h.size
                    e = self.view.roots[r].files.get(h.path)
                    if e is not None and e.sqn == h.sqn:
                        out.append((r, h))
                    else:  # replaced before it was persisted: nothing to write
                        dropped += h.size
            if dropped:
                self.pending_bytes -= dropped
                self.in_flight_bytes -= dropped
                self.cond.notify_all()
            if out:
                self.counts["flushes"] += 1
        return out

    def drive(self, root: str, app: str) -> None:
        """The driver of ``app`` runs ``root``'s batches from this host (it will commit
        here): from now on ``app``'s writes to it are held for the next commit."""
        with self.cond:
            new = (root, app) not in self._committers
            self._committers[(root, app)] = self._clock()
            self._in_batch[root] = app
            broadcast = self._notes is not None and self.crosshost.drive_due(root, time.monotonic())
        if new:
            log.info("application %r drives %s from this host: its state files are held", app, root)
        self.ensure(root)
        if broadcast:  # the other hosts' bridges hold this application's files for us
            self._send_note(BROADCAST, "drive", root=root, app=app, boot=self.boot)

    def commit(
        self,
        root: str,
        app: str,
        timeout: float,
        boot: str | None = None,
        file: tuple[str, bytes] | None = None,
    ) -> int:
        """The driver of ``app`` commits ``root``: from now on ``app``'s writes to it are
        held for the next commit on this bridge; persist the held ones and wait until
        every file accepted for ``root`` is durable (:meth:`wait_durable`), and for an
        idle flush of it still under way (:meth:`_idle_flushes`; its files are not
        counted). ``file``: the commit file (``commits/<N>``, its bytes reserved),
        accepted first and persisted in the same flush as the held state files, so that
        one object makes both durable. Raises WireError(``unavailable``) when ``boot``
        (the process the
        driver's ``drive`` reached) is not this one: the bridge restarted since and held
        files of the batch may be lost; or when a write or a holder's flush failed."""
        if boot is not None and boot != self.boot:
            raise WireError(
                "unavailable", "the bridge restarted during the batch: held state files lost"
            )
        self.ensure(root)
        self._batch_seen(root)
        deadline = time.monotonic() + timeout
        with self.cond:
            self._committers[(root, app)] = self._clock()
        if file is not None:
            self.reserve(len(file[1]))
            try:
                self.put(root, file[0], file[1], app)
            except BaseException:
                self.unreserve(len(file[1]))
                raise
        with self.cond:
            self._in_batch.pop(root, None)
            earlier = self._idle.pop(root, None)
        flush = self._start_flush(root)
        try:
            if earlier is not None:  # waited for, its files not counted (persisted before)
                self._finish_flush(root, earlier, deadline)
            waited = self._finish_flush(root, flush, deadline)
        finally:
            with self.cond:
                if earlier is not None:
                    self.crosshost.end_commit(earlier.cids)
                remote = self.crosshost.end_commit(flush.cids)
                self.ledger.on_commit(root, self._clock())
        return waited + remote

    def _start_flush(self, root: str) -> _Flush:
        """Persist ``root``'s held writes here and ask every holder elsewhere to persist
        theirs, all as one flush group (crosshost module docstring)."""
        with self.cond:
            targets = self.view.pending(root)
            flushes = self.crosshost.start_commit(root, time.monotonic())
        own = self._take_held(root)
        parts = len(flushes) + (1 if own else 0)
        gid = f"{query_key(root)}:{secrets.token_hex(6)}"
        with self.cond:
            cp = self.crosshost.commit_cp(root, _highest_version(own))
        for cid, (holder, boot) in flushes.items():
            self._send_note(
                holder, "flush", root=root, gid=gid, parts=parts, boot=boot, cid=cid, cp=cp
            )
        group = FlushGroup(gid, parts, self.crosshost.name, len(own)) if own else None
        self._persist_many(own, group, cp)
        return _Flush(targets, list(flushes))

    def _finish_flush(self, root: str, f: _Flush, deadline: float) -> int:
        """Wait until the flush ``f`` of ``root`` is durable everywhere (``deadline``,
        monotonic s); the files waited for here. Raises WireError(``unavailable``) as
        :meth:`commit` does."""
        waited = self.wait_durable(root, max(0.0, deadline - time.monotonic()), f.targets)
        self._wait_flushes(f.cids, deadline)
        return waited

    def _renew_drives(self) -> None:
        """Broadcast ``drive`` again for the roots whose batch runs, every DRIVE_RENEW s:
        notes are not retried, and a holder that missed the batch's first one (a node
        reconnecting) would persist its files one by one until the next batch."""
        if self._notes is None:
            return
        now = time.monotonic()
        with self.cond:
            due = [(r, a) for r, a in self._in_batch.items() if self.crosshost.drive_due(r, now)]
        for root, app in due:
            self._send_note(BROADCAST, "drive", root=root, app=app, boot=self.boot)

    def _idle_flushes(self) -> int:
        """Flush the roots this bridge commits that are between batches and whose held
        writes have been quiet for IDLE_QUIET s (:func:`idle_flush_due`), here and on the
        holders elsewhere; the number of roots flushed. The next commit of such a root
        waits for that flush to be durable (and fails if it failed)."""
        now = time.monotonic()
        with self.cond:
            self._retire_idle(now)
            committed = {r for r, _ in self._committers}
            due = []
            for r in sorted(committed - set(self._idle)):
                held = self._held.get(r, [])
                if not held and not self.crosshost.holders.get(r):
                    continue
                newest = max(
                    held[-1].since if held else float("-inf"),
                    self._hold_notes.get(r, float("-inf")),
                )
                if idle_flush_due(r in self._in_batch, newest, now):
                    due.append(r)
        for r in due:
            f = self._start_flush(r)
            with self.cond:
                self._idle[r] = f
                self.counts["idle_flushes"] += 1
        return len(due)

    def _retire_idle(self, now: float) -> None:
        """Forget idle flushes that succeeded (under ``cond``); a failed one stays for
        the root's next commit to report."""
        for r, f in list(self._idle.items()):
            if f.targets & self.view.pending(r):
                continue
            finished, error = self.crosshost.commit_state(f.cids, now)
            rv = self.view.roots.get(r)
            if finished and not error and (rv is None or not rv.failed):
                self.crosshost.end_commit(f.cids)
                del self._idle[r]

    def _wait_flushes(self, cids: list[str], deadline: float) -> None:
        """Wait for the holders' flushes of a commit (crosshost module docstring).
        Raises WireError(``unavailable``) when one failed, did not answer in time, or
        ``deadline`` (monotonic) passed."""
        if not cids:
            return
        with self.cond:
            while True:
                finished, error = self.crosshost.commit_state(cids, time.monotonic())
                if finished:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    error = "holders' state files not durable in time"
                    break
                self.cond.wait(min(left, 0.5))
            if error:
                raise WireError("unavailable", f"state files on another host: {error}")
            self.counts["remote_flushes"] += len(cids)

    def wait_written(self, root: str, path: str, sqn: int, timeout: float) -> None:
        """Wait until write ``sqn`` of ``path`` is durable (or replaced by a newer
        write). Raises WireError(``unavailable``) if it failed (then the root's next
        commit does not fail for it: the writer was told) or ``timeout`` s passed."""
        with self.cond:

            def waiting() -> bool:
                e = self.view.roots[root].files.get(path)
                return e is not None and e.sqn == sqn and e.data is not None

            done = self.cond.wait_for(lambda: not waiting(), timeout=timeout)
            rv = self.view.roots[root]
            e = rv.files.get(path)
            ok = e is not None and (e.sqn > sqn or (e.sqn == sqn and e.durable))
            if done and not ok:
                rv.failed.discard(path)
        if not done:
            raise WireError("unavailable", f"{path} not durable within {timeout} s")
        if not ok:
            raise WireError("unavailable", f"write of {path} failed")

    def _persist(
        self, root: str, path: str, sqn: int, kg: int, chunks: list[bytes], size: int
    ) -> None:
        self._persist_many([(root, _Held(path, sqn, kg, chunks, size, 0.0))])

    def _persist_many(
        self, writes: list[tuple[str, _Held]], group: FlushGroup | None = None, cp: int = 0
    ) -> None:
        """Persist each write as one segment of a fresh writer, the segments of ``group``
        (the node that writes them holds a group until all its parts arrived:
        aggregator/groups.py). Every writer is registered before the first persists,
        so the node's all-persisted rule cannot close an object while the rest are
        still on their way (one object per flush, size and delay permitting)."""
        c = self.client
        uploader: Any = c.uploader if group is None else _InGroup(c.uploader, group)
        writers: list[tuple[str, _Held, ChangelogWriter | BaseException]] = []
        # a flush's segments go with one checkpoint id, so that every node routes them
        # alike (an SST file's 0 would take another plan window's route: two objects)
        flush_cp = max(cp, _highest_version(writes))
        for root, h in writes:
            try:
                new = ChangelogWriter(
                    log_id(query_key(root), h.path), KEY_GROUPS, uploader, h.sqn,
                    NEVER_PREEMPT, c.in_flight, squash_entries=0,
                )  # fmt: skip
                new.compression = c.compression
                writers.append((root, h, new))
            except Exception as e:  # noqa: BLE001 - a refused writer is a failed write
                writers.append((root, h, e))
        for root, h, w in writers:
            self._start(root, h, w, flush_cp)

    def _start(self, root: str, h: _Held, w: ChangelogWriter | BaseException, cp: int) -> None:
        """Append ``h``'s changes to ``w`` and persist with checkpoint id ``cp``; the
        outcome to :meth:`_persisted`."""
        fut: Future[ChangelogHandle]
        try:
            if isinstance(w, BaseException):
                raise w
            for chunk in h.chunks:
                w.append(h.kg, chunk)
            fut = w.persist_durably(h.sqn, checkpoint_id=cp)
        except Exception as e:  # noqa: BLE001 - a refused persist is a failed write
            fut = Future()
            fut.set_exception(e)
        fut.add_done_callback(lambda f: self._persisted(root, h.path, h.sqn, h.size, w, f))

    def _persisted(
        self,
        root: str,
        path: str,
        sqn: int,
        size: int,
        w: ChangelogWriter | BaseException,
        fut: Future[ChangelogHandle],
    ) -> None:
        """Upload callback (an uploader thread): record the outcome, queue the work."""
        err = fut.exception()
        refs = () if err is not None else fut.result().segments
        with self.cond:
            e = self.view.roots[root].files.get(path)
            if err is None and e is not None and e.sqn == sqn and e.data is not None:
                self._keep_for_reads(root, path, e)
            if err is not None or len(refs) != 1:
                log.warning("write of %s (sqn %d) failed: %s", path, sqn, err or refs)
                self.view.on_failed(root, path, sqn)
                self.counts["failed"] += 1
            else:
                self._todo.extend(self.view.on_durable(root, path, sqn, refs[0]))
                self.counts["durable"] += 1
                self.ledger.on_durable(root, refs[0].path)
            self.pending_bytes -= size
            self.in_flight_bytes -= size
            self.cond.notify_all()
        if isinstance(w, ChangelogWriter):
            with contextlib.suppress(DstlError):  # the client is closing
                w.close()

    # -- notes between hosts (crosshost module) -----------------------------------------
    def _subscribe(self) -> Any:
        """The uploader notes go through (None: no node, or no bridge name), subscribed
        under this bridge's name."""
        up = self.client.uploader
        if not self.bridge_id or not hasattr(up, "subscribe"):
            return None
        try:
            up.subscribe(self.bridge_id, self._on_note)
        except (DstlError, ValueError) as e:
            log.warning("no notes between hosts: %s", e)
            return None
        return up

    def _send_note(self, to: str, op: str, **fields: Any) -> None:
        if self._notes is None:
            return
        try:
            self._notes.send_note(Note(to, self.bridge_id, dump_body(op, **fields)))
        except (DstlError, ValueError) as e:
            log.warning("note %s to %s not sent: %s", op, to, e)

    def _on_note(self, note: Note) -> None:
        """A note from another host (the uploader's I/O thread): handled on a pool."""
        with self.cond:
            if self._note_pool is None:
                self._note_pool = ThreadPoolExecutor(4, thread_name_prefix="bridge-notes")
            pool = self._note_pool
        with contextlib.suppress(RuntimeError):  # shut down: the bridge stops
            pool.submit(self._handle_note, note)

    def _handle_note(self, note: Note) -> None:
        try:
            d = load_body(note.body)
        except WireError as e:
            with self.cond:
                self.counts["notes_refused"] += 1
            log.warning("note from %s refused: %s", note.frm, e)
            return
        op, frm, now = d["op"], note.frm, time.monotonic()
        if op == "flush":
            self._flush_for(d, frm)
            return
        with self.cond:
            if op == "drive":
                self.crosshost.on_drive(d, frm, now)
            elif op == "hold":
                self.crosshost.on_hold(d, frm)
                self._hold_notes[d["root"]] = now
            elif op == "held" and self._announcing.get(d["root"], ("", None))[0] == frm:
                _, ev = self._announcing.pop(d["root"])  # only the committer asked answers
                self.crosshost.announced[d["root"]] = frm
                ev.set()
            elif op == "flushing":
                self.crosshost.on_flushing(d, frm)
            elif op == "flushed":
                self.crosshost.on_flushed(d, frm)
            self.cond.notify_all()
        if op == "hold":
            self._send_note(frm, "held", root=d["root"])

    def _announce(self, root: str, remote: Remote, cp: int) -> bool:
        """Make sure the committer ``remote`` knows this bridge holds files of ``root``
        for its next commit (one hold note per commit); whether it does. After a hold
        nobody answered, writes of ``root`` are persisted at once for HOLD_RETRY s
        (every node down, or the committer gone: no put waits HOLD_WAIT each)."""
        now = time.monotonic()
        with self.cond:
            if self.crosshost.announced.get(root) == remote.bridge:
                return True
            if now - self._unanswered.get(root, float("-inf")) < HOLD_RETRY:
                return False
            asked = self._announcing.get(root)
            first = asked is None or asked[0] != remote.bridge
            if first:
                self._announcing[root] = (remote.bridge, threading.Event())
            ev = self._announcing[root][1]
        if first:
            self._send_note(remote.bridge, "hold", root=root, app="", boot=self.boot, cp=cp)
        if ev.wait(crosshost.HOLD_WAIT):
            return True
        with self.cond:
            if self._announcing.get(root, ("", None))[1] is ev:
                del self._announcing[root]
            self._unanswered[root] = time.monotonic()
        log.warning("no answer from %s for %s: state files are persisted at once", remote, root)
        return False

    def _flush_for(self, d: dict[str, Any], frm: str) -> None:
        """The committer ``frm`` commits ``d['root']``: persist the writes held for it as
        a part of its flush group, answer once they are durable."""
        cid, root = d["cid"], d["root"]
        self._send_note(frm, "flushing", cid=cid)
        if d["boot"] != self.boot:
            self._send_note(frm, "flushed", cid=cid, ok=False, error="bridge restarted")
            return
        self._batch_seen(root)
        with self.cond:
            self.crosshost.announced.pop(root, None)  # the next write announces again
            # every write not yet durable, also those persisted before (max_hold, ...)
            targets = self.view.pending(root) if root in self.view.roots else set()
        own = self._take_held(root) if root in self.view.roots else []
        parts = max(1, d["parts"])
        group = FlushGroup(d["gid"], parts, self.crosshost.name, len(own)) if own else None
        self._persist_many(own, group, int(d.get("cp", 0)))
        try:
            if targets:
                self.wait_durable(root, FLUSH_WAIT, targets)
        except WireError as e:
            self._send_note(frm, "flushed", cid=cid, ok=False, n=len(own), error=str(e)[:200])
            return
        self._send_note(frm, "flushed", cid=cid, ok=True, n=len(own))

    def close_notes(self) -> None:
        """Stop handling notes (the bridge stops)."""
        with self.cond:
            pool, self._note_pool = self._note_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def wait_durable(
        self, root: str, timeout: float, targets: set[tuple[str, int]] | None = None
    ) -> int:
        """Wait until every file accepted for ``root`` (or the writes ``targets``, (path,
        SQN) pairs) is durable; the number waited for. Raises WireError
        (``unavailable``) on a failed write or a timeout."""
        self.ensure(root)
        with self.cond:
            if targets is None:
                targets = self.view.pending(root)
            done = self.cond.wait_for(
                lambda: not targets & self.view.pending(root), timeout=timeout
            )
            failed = self.view.take_failures(root)
        if failed:
            raise WireError("unavailable", f"{len(failed)} files failed: {sorted(failed)[:5]}")
        if not done:
            raise WireError("unavailable", f"not durable within {timeout} s")
        return len(targets)

    # -- reads -------------------------------------------------------------------------
    def stat(self, root: str, path: str) -> int | None:
        """The file's length in bytes, None if absent (after a refresh, at most one a
        second: another host's bridge may have written it)."""
        self.ensure(root)
        with self.cond:
            e = self.view.get(root, path)
        if e is None and self._may_be_elsewhere(path) and self._refresh_on_miss(root):
            with self.cond:
                e = self.view.get(root, path)
        return None if e is None else e.length

    @staticmethod
    def _may_be_elsewhere(path: str) -> bool:
        """Whether a file missing here may have been written by another host's bridge
        since this view was loaded: a state file (executors write them anywhere); the
        other files of a location are the driver's, written through this bridge while
        it drives the root (a driver that moved hosts meets a fresh view)."""
        return paths.kind(path) == paths.STATE

    def read(self, root: str, path: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (b"" past the end). Raises
        WireError(``not-found``; ``unavailable`` when the store fails)."""
        self.ensure(root)
        with self.cond:
            e = self.view.get(root, path)
        if e is None and self._may_be_elsewhere(path) and self._refresh_on_miss(root):
            with self.cond:
                e = self.view.get(root, path)
        if e is None:
            raise WireError("not-found", f"no file {path}")
        with self.cond:
            data = e.data
        if data is None:
            data = self._read_durable(root, path, e)
        return data[offset : offset + length]

    def _keep_for_reads(self, root: str, path: str, e: Entry) -> None:
        """Keep a durable log entry's bytes for reads (under ``cond``): Spark reads the
        driver's logs back (the last offsets and commits at each start, the sources' log
        at each batch), a GET each otherwise. State files are read back rarely (a
        reload), from the object."""
        if e.data is None or paths.kind(path) == paths.STATE:
            return
        self._cache[(root, path, e.sqn)] = e.data
        self._cache_bytes += len(e.data)
        self._trim_cache()

    def _trim_cache(self) -> None:
        while self._cache_bytes > self._cache_max and self._cache:
            self._cache_bytes -= len(self._cache.popitem(last=False)[1])

    def _read_durable(self, root: str, path: str, e: Entry) -> bytes:
        key = (root, path, e.sqn)
        with self.cond:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        assert e.ref is not None
        try:
            seg = read_segment(self.store, e.ref, e.ref.log_id)
        except DstlError as err:
            raise WireError("unavailable", f"cannot read {path}: {err}") from err
        data = b"".join(seg.changes(DATA_KEY_GROUP, e.sqn, e.sqn + 1))
        with self.cond:
            self._cache[key] = data
            self._cache_bytes += len(data)
            self._trim_cache()
        return data

    def listing(self, root: str, d: str) -> tuple[list[tuple[str, int]], list[str]]:
        """Direct children of ``d`` (see :meth:`View.listing`), after a refresh at most
        once a second when other hosts may have written there (the state directories;
        the driver's logs are written here only, :meth:`_may_be_elsewhere`)."""
        self.ensure(root)
        if d.startswith("state/") or d in ("", "state"):
            self._refresh_on_miss(root)
        with self.cond:
            return self.view.listing(root, d)

    # -- housekeeping ------------------------------------------------------------------
    def housekeep(self, final: bool = False) -> None:
        """Persist writes held longer than ``max_hold``, write the manifests of changed
        roots, then release objects whose every segment is dead (read their index,
        delete them); every SWEEP_INTERVAL s also delete orphans (:meth:`sweep`).
        ``final`` (the bridge stops, no write is on its way): sweep objects of any age,
        then manifests and releases again until nothing changes (4 rounds at most).
        Storage errors are logged."""
        self.flush(older_than=self.max_hold)
        if not final:
            self._renew_drives()
            self._idle_flushes()
        for root in list(self._ready):
            self.refresh(root)
        with self.cond:
            gone = self._clock() - COMMITTER_TTL
            for k in [k for k, t in self._committers.items() if t < gone]:
                del self._committers[k]
        self._manifests_and_releases(final)
        if not final and time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + SWEEP_INTERVAL
        for _ in range(4 if final else 1):
            swept = self.sweep(min_age=0.0 if final else SWEEP_MIN_AGE)
            if not self._manifests_and_releases(final) and not swept:
                return

    def _batch_seen(self, root: str) -> None:
        """A batch of ``root`` ended here (a commit, or a holder's flush)."""
        with self.cond:
            self._batches.setdefault(root, deque(maxlen=MANIFEST_BATCHES + 1)).append(
                time.monotonic()
            )

    def _manifest_due(self, root: str, now: float) -> bool:
        """Whether ``root``'s manifest may be written now: at most once per
        MANIFEST_BATCHES of its batches (their recent mean interval), at least every
        MANIFEST_MAX_WAIT s (the housekeeper's interval bounds it from below)."""
        return manifest_due(self._manifested.get(root), list(self._batches.get(root, ())), now)

    def _manifests_and_releases(self, final: bool = False) -> int:
        """Write the manifests of changed roots that are due (all when ``final``), then
        run the queued releases; the number of manifests written."""
        now = time.monotonic()
        with self.cond:
            due = [r for r in list(self.view.roots) if final or self._manifest_due(r, now)]
            docs = [(r, m) for r in due if (m := self.view.manifest(r))]
            for r, _ in docs:
                self._manifested[r] = now
        for root, doc in docs:
            self._write_manifest(root, doc)
        self._run_todo()
        return len(docs)

    def sweep(self, min_age: float = SWEEP_MIN_AGE) -> int:
        """Delete the orphans of the queries this bridge serves: objects modified at
        least ``min_age`` s ago whose every index row is dead in the view
        (:meth:`View.is_orphan`: copies of writes sent again or fallen back to the DFS,
        writes reported failed); the number deleted. Objects holding only rows of other
        writers or queries are remembered and not read again while none of their queries
        is served here. Storage errors are logged (the next sweep tries again)."""
        now = self._clock()
        try:
            infos = self.store.list_info(self.store.changelog_root())
        except (DstlError, OSError) as e:
            log.warning("orphan sweep: cannot list objects: %s", e)
            return 0
        candidates = self._sweep_candidates(infos, now - min_age)
        present = {i.url for i in infos}
        shared = self._shared_roots()
        deleted = 0
        for url, (refs, mtime) in candidates.items():
            aged = mtime is not None and now - mtime >= SHARED_ORPHAN_AGE
            with self.cond:
                orphan = self.view.is_orphan(url, refs, shared, aged, present)
            if orphan and self._delete_orphan(url):
                deleted += 1
        return deleted

    def _sweep_candidates(
        self, infos: list[Any], before: float
    ) -> dict[str, tuple[list[SegmentRef], float | None]]:
        """Index rows (and modification time) of the listed objects a sweep judges:
        written objects modified before ``before`` that hold no live segment here and
        only rows of queries served here (unreadable ones are skipped)."""
        with self.cond:
            busy = {u for u, o in self.view.objects.items() if o.live}
            served = {rv.key for r, rv in self.view.roots.items() if r in self._ready}
        self._foreign = {i.url: k for i in infos if (k := self._foreign.get(i.url)) is not None}
        out: dict[str, tuple[list[SegmentRef], float | None]] = {}
        for info in infos:
            url = info.url
            if not url.endswith(".dstl") or info.size == 0 or url in busy:
                continue
            if (info.mtime is not None and info.mtime > before) or (
                url in self._foreign and not _judgeable(self._foreign[url], served)
            ):
                continue
            try:
                refs = read_index(self.store, url, verify=False)
            except (CorruptObjectError, DstlError) as e:
                log.debug("orphan sweep: skipping %s: %s", url, e)
                continue
            keys = frozenset((p or ("",))[0] for p in (parse_log_id(r.log_id) for r in refs))
            if not _judgeable(keys, served):
                self._foreign[url] = keys  # read again only once all its queries are served
                continue
            out[url] = (refs, info.mtime)
        return out

    def _shared_roots(self) -> set[str]:
        """The served roots another bridge has written a manifest of (a root whose
        manifests cannot be listed counts as shared)."""
        out: set[str] = set()
        for root in list(self._ready):
            try:
                bridges = set(self._newest_infos(root))
            except (DstlError, OSError) as e:
                log.warning("orphan sweep: cannot list manifests of %s: %s", root, e)
                bridges = {"?"}
            if bridges - {self.bridge_id, ""}:
                out.add(root)
        return out

    def _delete_orphan(self, url: str) -> bool:
        try:
            self.store.delete([url])
        except DstlError as e:
            log.warning("orphan %s not deleted: %s", url, e)
            return False
        log.info("orphan sweep: deleted %s (no segment in it is needed)", url)
        with self.cond:
            self.counts["orphans_deleted"] += 1
            self._todo.extend(self.view.on_object_deleted(url))
        return True

    def _write_manifest(self, root: str, doc: dict[str, Any]) -> None:
        folder = self.manifest_dir(root)
        name = f"{self.bridge_id}-{doc['seq']}" if self.bridge_id else str(doc["seq"])
        url = f"{folder}/manifest-{name}.json"
        try:
            written = manifest_to_store(doc, self.store.base_url)
            self.store.put(url, json.dumps(written, separators=(",", ":")).encode())
        except DstlError as e:
            log.warning("manifest %s not written: %s", url, e)
            with self.cond:
                self.view.roots[root].dirty = True
            return
        with self.cond:
            self._todo.extend(self.view.on_manifest_written(root, doc["seq"]))
            self.counts["manifests"] += 1
        mine: list[tuple[int, str]] = []
        legacy: list[str] = []  # format 1's names: this bridge adopted them at load
        for u in self.store.list_files(folder):
            named = manifest_name(u)
            if named is not None and named[0] == self.bridge_id:
                mine.append((named[1], u))
            elif named is not None and named[0] == "":
                legacy.append(u)
        mine.sort()
        try:
            self.store.delete([u for _, u in mine[:-MANIFESTS_KEPT]] + legacy)
        except DstlError as e:
            log.warning("old manifests of %s not deleted: %s", root, e)

    def _run_todo(self) -> None:
        while True:
            with self.cond:
                if not self._todo:
                    return
                ins = self._todo.popleft()
            out = self._release(ins) if isinstance(ins, ReadIndex) else self._delete(ins)
            with self.cond:
                self._todo.extend(out)

    def _release(self, ins: ReadIndex) -> list[Instruction]:
        try:
            refs = read_index(self.store, ins.url, verify=False)
        except (CorruptObjectError, DstlError) as e:
            log.warning("index of %s not read: %s", ins.url, e)
            with self.cond:
                self.view.on_index_failed(ins.url)
            return []
        with self.cond:
            return self.view.on_index(ins.url, refs)

    def _delete(self, ins: DeleteObject) -> list[Instruction]:
        try:
            self.store.delete([ins.url])
        except DstlError as e:
            log.warning("object %s not deleted: %s", ins.url, e)
            return []
        with self.cond:
            self.counts["objects_deleted"] += 1
            return self.view.on_object_deleted(ins.url)


def _highest_version(writes: list[tuple[str, _Held]]) -> int:
    """The highest state version the files of ``writes`` name (0: none)."""
    return max((checkpoint_id(h.path) for _, h in writes), default=0)


class _InGroup:
    """An uploader whose items go as members of one flush group."""

    def __init__(self, uploader: Any, group: FlushGroup) -> None:
        self._up, self._group = uploader, group

    def register(self, log_id: str) -> None:
        self._up.register(log_id)

    def unregister(self, log_id: str) -> None:
        self._up.unregister(log_id)

    def submit(self, item: PersistItem) -> Any:
        return self._up.submit(item if item.data is None else item.in_group(self._group))

    def close(self) -> None:
        """The shared uploader is closed by its client."""


def _judgeable(keys: frozenset[str], served: set[str]) -> bool:
    """Whether an object whose rows are of the queries ``keys`` ("": a writer that is no
    bridge's) can be an orphan of a bridge serving ``served``: all of them served."""
    return bool(keys) and keys <= served


def _concurrently(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``[fn(x) for x in items]``, READERS calls at a time (reads of objects on a store
    wait on its latency, not on this process: a rebuild or a refresh that reads
    hundreds of indexes one after the other keeps a request waiting for minutes on an
    object store); the first error is raised (calls not started yet are cancelled,
    those running end first)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(READERS, len(items)), thread_name_prefix="bridge-read") as pool:
        return list(pool.map(fn, items))
