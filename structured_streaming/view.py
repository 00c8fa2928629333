"""The bridge's pure state (no I/O): which tree segment holds which state file.

Events in, instructions out (the dask worker state machine's style): the bridge shell
calls the ``on_*`` methods as things happen and carries out the instructions they
return; :meth:`View.validate` checks every invariant.

Per query root (:class:`RootView`): files by relative path, each an :class:`Entry`
holding its bytes until they are durable and the :class:`SegmentRef` after; a deleted
file leaves a *tombstone* entry (written as a segment too, so that a rebuild from
object indexes does not bring the file back) until every object holding an older
version of it is gone. Every write has an SQN of its own, increasing with time
(microseconds since the epoch, at least one above the previous write of this view),
so "newest SQN wins" orders writes across bridge restarts.

Several bridges (one per host) may serve one query root. Each entry names the bridge
that wrote it (``by``); a bridge's manifest holds only its own entries, a rebuild merges
the newest manifest of every bridge (newest SQN wins) and adopts the files found only
in object indexes, and :meth:`View.on_merge` takes in other bridges' newer manifests.
A bridge tracks, and releases, only objects holding its own writes.

Per object (:class:`ObjectState`): the segments of this view's own files it holds, live
or dead. An object with no live segment is a release candidate (:class:`ReadIndex`); the
shell reads its index and the view asks to delete it (:class:`DeleteObject`) only when
every segment in it is one this view knows to be dead, and a manifest written after
the last death is durable (a rebuild from an older manifest would otherwise point into
a deleted object).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dstltree.client.handle import SegmentRef

MANIFEST_FORMAT = 3  # 3: objects named relative to the base path; 2: absolute URLs
READ_MANIFEST_FORMATS = (1, 2, 3)  # 2: "bridge" and per file "by"; 1: one bridge per root
RELATIVE_FORMATS = (3,)
LOG_PREFIX = "ss"
DATA_KEY_GROUP = 0  # a file's bytes: one change per chunk
TOMBSTONE_KEY_GROUP = 1  # a deletion: one empty change
KEY_GROUPS = range(0, 2)
MAX_LOG_ID = 256  # ChangelogWriter's bound


def query_key(root: str) -> str:
    """The first 16 hex digits of sha256(root URI): the query's name in log ids."""
    return hashlib.sha256(root.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def log_id(root_key: str, path: str) -> str:
    """``ss/<query key>/<path>``: the writer (and segment) name of one file."""
    return f"{LOG_PREFIX}/{root_key}/{path}"


def manifest_path(root_key: str, manifest: Mapping[str, Any]) -> str:
    """Where the bridge writes ``manifest`` (its ``bridge`` and ``seq``), relative to the
    job folder: ``ss/<query key>/manifest-<bridge>-<seq>.json``, or
    ``manifest-<seq>.json`` for a lone bridge's (format 1 names no bridge); for errors."""
    bridge = manifest.get("bridge") or ""
    name = f"{bridge}-{manifest.get('seq')}" if bridge else str(manifest.get("seq"))
    return f"{LOG_PREFIX}/{root_key}/manifest-{name}.json"


def manifest_to_store(doc: Mapping[str, Any], base: str) -> dict[str, Any]:
    """``doc`` (a manifest as :meth:`View.manifest` makes it, URLs absolute) as written:
    every object below ``base`` (the store's base URL) named relative to it, so that a
    base path copied to another bucket or folder restores as it is."""
    prefix = base.rstrip("/") + "/"

    def rel(url: str) -> str:
        return url[len(prefix) :] if url.startswith(prefix) else url

    return _map_urls(doc, rel)


def manifest_from_store(doc: Mapping[str, Any], base: str, name: str) -> dict[str, Any]:
    """A manifest as read from the store (``name``: its path, for errors), its object
    names made absolute below ``base`` when its format names them relative. Raises
    ValueError for a name that climbs out of the base (``..``) or is absolute where a
    relative one belongs."""
    if doc.get("format") not in RELATIVE_FORMATS:
        return dict(doc)

    def absolute(path: str) -> str:
        parts = path.split("/")
        if "://" in path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{name}: object name {path!r} is not a path below the base")
        return f"{base.rstrip('/')}/{path}"

    return _map_urls(doc, absolute)


def _map_urls(doc: Mapping[str, Any], fn: Any) -> dict[str, Any]:
    files = {}
    for path, d in doc.get("files", {}).items():
        seg = dict(d["segment"])
        seg["path"] = fn(seg["path"])
        files[path] = {**d, "segment": seg, "older": [fn(u) for u in d.get("older", [])]}
    return {**doc, "files": files}


def parse_log_id(name: str) -> tuple[str, str] | None:
    """(query key, path) of a bridge log id, None for any other writer's log id."""
    parts = name.split("/", 2)
    if len(parts) != 3 or parts[0] != LOG_PREFIX or len(parts[1]) != 16:
        return None
    return parts[1], parts[2]


@dataclass
class Entry:
    """One version of a file. ``data``: its bytes while not yet durable (None after);
    ``ref``: its segment once durable; ``deleted``: a tombstone; ``older``: objects
    holding older versions of a deleted file (the tombstone goes once they are gone)."""

    sqn: int
    length: int
    data: bytes | None = None
    ref: SegmentRef | None = None
    deleted: bool = False
    failed: bool = False
    older: set[str] = field(default_factory=set)
    by: str = ""  # the bridge that wrote it
    prev: Entry | None = None  # the durable version a write not yet durable replaces

    @property
    def durable(self) -> bool:
        return self.ref is not None


@dataclass
class RootView:
    """The files of one query root. ``manifest_seq``: snapshots taken for manifests
    (the next one gets this number); ``manifest_written``: the newest durable one
    (-1: none); ``dirty``: changed since the last snapshot."""

    root: str
    key: str
    files: dict[str, Entry] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    manifest_seq: int = 0
    manifest_written: int = -1
    dirty: bool = False


@dataclass
class ObjectState:
    """This view's segments in one object: ``live`` (root key, path, sqn) still
    referenced; ``dead`` (log id, sqn) replaced or deleted, with the manifest number of
    their root after which the death is recorded (root key -> seq)."""

    live: set[tuple[str, str, int]] = field(default_factory=set)
    dead: set[tuple[str, int]] = field(default_factory=set)
    deaths: dict[str, int] = field(default_factory=dict)
    asked: bool = False  # a ReadIndex is out for it


@dataclass(frozen=True)
class ReadIndex:
    """Instruction: read object ``url``'s index and call :meth:`View.on_index`."""

    url: str


@dataclass(frozen=True)
class DeleteObject:
    """Instruction: delete object ``url`` then call :meth:`View.on_object_deleted`."""

    url: str


Instruction = ReadIndex | DeleteObject


class View:
    """Every root this bridge knows, and the objects holding their files. ``me``: this
    bridge's id (written into its manifests and entries)."""

    def __init__(self, me: str = "") -> None:
        self.me = me
        self.roots: dict[str, RootView] = {}  # by root URI
        self.objects: dict[str, ObjectState] = {}
        self.merged: dict[tuple[str, str], int] = {}  # (root, bridge) -> manifest seq taken
        self._last_sqn = 0

    # -- roots ---------------------------------------------------------------------------
    def root(self, root: str) -> RootView | None:
        return self.roots.get(root)

    def new_sqn(self, now_us: int) -> int:
        """An SQN for a new write: ``now_us`` (microseconds), at least one above the last."""
        self._last_sqn = max(now_us, self._last_sqn + 1)
        return self._last_sqn

    def on_loaded(
        self,
        root: str,
        manifests: Mapping[str, Any] | Iterable[Mapping[str, Any]] | None,
        segments: Iterable[SegmentRef],
    ) -> list[Instruction]:
        """Rebuild ``root`` from the newest manifest of every bridge (:meth:`manifest`'s
        form; one, several or None) and the ``segments`` of the objects newer than the
        oldest of them (index rows of any writer: the root's are picked by log id);
        newest SQN wins, and a file found only in an index is adopted as this bridge's.
        Tombstones with no older object left go at once (their segments die). Raises
        ValueError for a manifest of another format or root."""
        key = query_key(root)
        rv = RootView(root, key)
        self.roots[root] = rv
        docs = [manifests] if isinstance(manifests, Mapping) else list(manifests or [])
        for m in docs:
            self._load_manifest(rv, m)
        for ref in segments:
            parsed = parse_log_id(ref.log_id)
            if parsed is None or parsed[0] != key or ref.meta.is_marker:
                continue
            self._take(rv, parsed[1], ref)
        for path, e in rv.files.items():
            if e.ref is not None and e.by == self.me:
                self._obj(e.ref.path).live.add((key, path, e.sqn))
        self._last_sqn = max([self._last_sqn, *(e.sqn for e in rv.files.values())])
        out: list[Instruction] = []
        for path in [p for p, e in rv.files.items() if e.deleted]:
            out += self._prune_tombstone(rv, path)
        return out

    def _manifest_entries(self, rv: RootView, m: Mapping[str, Any]) -> dict[str, Entry]:
        """A manifest's entries, each naming its writer (a format-1 manifest's are this
        bridge's: it was the only one). Raises ValueError for another format or root."""
        fmt = m.get("format")
        if fmt not in READ_MANIFEST_FORMATS:
            known = ", ".join(map(str, READ_MANIFEST_FORMATS))
            raise ValueError(
                f"{manifest_path(rv.key, m)}: manifest format {fmt!r} is unknown to this "
                f"dstltree (it reads {known}); written by a newer version?"
            )
        if m.get("root") != rv.root:
            raise ValueError(f"{manifest_path(rv.key, m)}: a manifest of {m.get('root')!r}")
        bridge = self.me if fmt == 1 else str(m.get("bridge", ""))
        out: dict[str, Entry] = {}
        for path, d in m["files"].items():
            ref = SegmentRef.from_dict(d["segment"], log_id(rv.key, path))
            e = Entry(int(d["sqn"]), int(d["length"]), ref=ref, deleted=bool(d["deleted"]))
            e.older = set(d.get("older", []))
            e.by = bridge if fmt == 1 else str(d.get("by", bridge))
            out[path] = e
        return out

    def _load_manifest(self, rv: RootView, m: Mapping[str, Any]) -> None:
        for path, e in self._manifest_entries(rv, m).items():
            cur = rv.files.get(path)
            if cur is None or e.sqn > cur.sqn:
                rv.files[path] = e
        bridge = self.me if m.get("format") == 1 else str(m.get("bridge", ""))
        self.merged[(rv.root, bridge)] = int(m["seq"])
        if bridge == self.me:
            rv.manifest_seq = max(rv.manifest_seq, int(m["seq"]) + 1)
            rv.manifest_written = max(rv.manifest_written, int(m["seq"]))

    def on_merge(self, root: str, manifests: Iterable[Mapping[str, Any]]) -> list[Instruction]:
        """Other bridges' newer manifests of ``root``: their entries newer than this
        view's replace them (this bridge's replaced segments die), and this view's
        entries of such a bridge missing from its newer manifest go (it replaced or
        deleted them). Raises ValueError for a manifest of another format or root."""
        rv = self.roots[root]
        out: list[Instruction] = []
        for m in manifests:
            bridge = str(m.get("bridge", ""))
            legacy = m.get("format") == 1  # its files were adopted at load
            if bridge == self.me or legacy or int(m["seq"]) <= self.merged.get((root, bridge), -1):
                continue
            entries = self._manifest_entries(rv, m)
            for path in [p for p, e in rv.files.items() if e.by == bridge and p not in entries]:
                del rv.files[path]  # gone from its writer's durable view: not served here
            for path, e in entries.items():
                cur = rv.files.get(path)
                if cur is not None and e.sqn <= cur.sqn:
                    continue
                if cur is not None and cur.by == self.me:
                    self._supersede(rv, path)
                    if cur.ref is not None and cur.ref.path in self.objects:
                        out += self._maybe_release(cur.ref.path)
                rv.files[path] = e
                self._last_sqn = max(self._last_sqn, e.sqn)  # a later write here is newer
            self.merged[(root, bridge)] = int(m["seq"])
        return out

    def _take(self, rv: RootView, path: str, ref: SegmentRef) -> None:
        """Index row ``ref`` of ``path`` during a rebuild: newest SQN wins; an older
        version of a deleted file keeps its tombstone."""
        cur = rv.files.get(path)
        deleted = TOMBSTONE_KEY_GROUP in ref.key_groups
        if cur is not None and cur.sqn >= ref.sqn_from:
            older = cur.deleted and cur.ref is not None and cur.ref.path != ref.path
            if older and cur.sqn > ref.sqn_from:
                cur.older.add(ref.path)
            return
        e = Entry(ref.sqn_from, 0 if deleted else -1, ref=ref, deleted=deleted, by=self.me)
        if cur is not None and deleted and cur.ref is not None and cur.ref.path != ref.path:
            e.older = {cur.ref.path, *cur.older}
        rv.files[path] = e

    def on_found(self, root: str, segments: Iterable[SegmentRef]) -> None:
        """Index rows of objects written since the last scan (a miss looked for a file
        another host's bridge wrote and has not put in a manifest yet): rows newer than
        this view's entries replace them as files of an unknown writer (``by`` "":
        neither in this bridge's manifests nor released by it; their length is read by
        the shell). This bridge's replaced segments die."""
        rv = self.roots[root]
        for ref in segments:
            parsed = parse_log_id(ref.log_id)
            if parsed is None or parsed[0] != rv.key or ref.meta.is_marker:
                continue
            path = parsed[1]
            cur = rv.files.get(path)
            if cur is not None and ref.sqn_from <= cur.sqn:
                continue
            deleted = TOMBSTONE_KEY_GROUP in ref.key_groups
            if cur is not None and cur.by == self.me:
                self._supersede(rv, path)
            rv.files[path] = Entry(ref.sqn_from, 0 if deleted else -1, ref=ref, deleted=deleted)
            self._last_sqn = max(self._last_sqn, ref.sqn_from)

    # -- writes --------------------------------------------------------------------------
    def on_accepted(self, root: str, path: str, data: bytes, sqn: int) -> None:
        """A whole file was accepted (its bytes in memory, handed to the writer). The
        durable version it replaces, this bridge's own, stays alive (and in manifests)
        until the new one is durable: a crash before then leaves the older version."""
        rv = self.roots[root]
        cur = rv.files.get(path)
        prev = None
        if cur is not None and cur.by == self.me and not cur.deleted:
            prev = cur if cur.ref is not None else cur.prev
        if prev is None and cur is not None:
            self._supersede(rv, path)
            rv.dirty = True  # the version it replaces leaves the manifest
        rv.files[path] = Entry(sqn, len(data), data=data, by=self.me, prev=prev)
        # a new file changes no manifest until it is durable (manifests hold durable
        # files only): a batch's puts do not make the root's manifest due

    def on_delete(self, root: str, path: str, sqn: int) -> bool:
        """Delete ``path``; returns whether it existed (then the shell writes a
        tombstone segment with ``sqn``)."""
        rv = self.roots[root]
        cur = rv.files.get(path)
        if cur is None or cur.deleted:
            return False
        older = self._supersede(rv, path)
        rv.files[path] = Entry(sqn, 0, data=b"", deleted=True, older=older, by=self.me)
        rv.dirty = True
        return True

    def _supersede(self, rv: RootView, path: str) -> set[str]:
        """The current entry of ``path`` is replaced: its segment dies. Returns the
        objects still holding older versions (for a tombstone)."""
        cur = rv.files.get(path)
        if cur is None:
            return set()
        older = set(cur.older)
        for e in (cur, cur.prev):
            if e is not None and e.ref is not None:
                if e.by == self.me:  # another bridge's segment is its own to release
                    self._kill(rv, path, e.sqn, e.ref.path)
                older.add(e.ref.path)
        cur.prev = None
        return older

    def _kill(self, rv: RootView, path: str, sqn: int, url: str) -> list[Instruction]:
        obj = self._obj(url)
        obj.live.discard((rv.key, path, sqn))
        obj.dead.add((log_id(rv.key, path), sqn))
        obj.deaths[rv.key] = max(obj.deaths.get(rv.key, -1), rv.manifest_seq)
        rv.dirty = True
        return self._maybe_release(url)

    def on_durable(self, root: str, path: str, sqn: int, ref: SegmentRef) -> list[Instruction]:
        """The write ``sqn`` of ``path`` is durable in segment ``ref``. A write already
        replaced dies at once."""
        rv = self.roots[root]
        cur = rv.files.get(path)
        if cur is None or cur.sqn != sqn:
            self._obj(ref.path)
            return self._kill(rv, path, sqn, ref.path)
        cur.ref, cur.data = ref, None
        cur.older.discard(ref.path)
        self._obj(ref.path).live.add((rv.key, path, sqn))
        rv.dirty = True
        out: list[Instruction] = []
        prev, cur.prev = cur.prev, None
        if prev is not None and prev.ref is not None:  # replaced now that this is durable
            out += self._kill(rv, path, prev.sqn, prev.ref.path)
        return out + self._prune_tombstone(rv, path)

    def on_failed(self, root: str, path: str, sqn: int) -> None:
        """The write ``sqn`` of ``path`` failed: the file is lost (a tombstone that
        failed leaves the file deleted in this view); the next commit of the root fails."""
        rv = self.roots[root]
        cur = rv.files.get(path)
        if cur is None or cur.sqn != sqn:
            return
        rv.failed.add(path)
        if cur.prev is not None:
            rv.files[path] = cur.prev  # the version it was to replace is still there
        elif cur.deleted and cur.older:
            cur.failed, cur.data = True, None
        else:
            del rv.files[path]
        rv.dirty = True

    def pending(self, root: str) -> set[tuple[str, int]]:
        """(path, sqn) of the root's writes not yet durable (nor failed)."""
        rv = self.roots.get(root)
        if rv is None:
            return set()
        return {(p, e.sqn) for p, e in rv.files.items() if e.data is not None}

    def take_failures(self, root: str) -> set[str]:
        """Paths whose write failed since the last call (for a commit's reply)."""
        rv = self.roots[root]
        out, rv.failed = rv.failed, set()
        return out

    # -- reads ---------------------------------------------------------------------------
    def get(self, root: str, path: str) -> Entry | None:
        """The live entry of a file (None: absent or deleted)."""
        rv = self.roots.get(root)
        e = None if rv is None else rv.files.get(path)
        return None if e is None or e.deleted else e

    def listing(self, root: str, d: str) -> tuple[list[tuple[str, int]], list[str]]:
        """Direct children of directory ``d`` ("": the root): ([(file name, length)],
        [dir names]), each sorted."""
        rv = self.roots.get(root)
        files: dict[str, int] = {}
        dirs: set[str] = set()
        prefix = d + "/" if d else ""
        for path, e in rv.files.items() if rv else ():
            if e.deleted or not path.startswith(prefix):
                continue
            head, sep, _ = path[len(prefix) :].partition("/")
            if sep:
                dirs.add(head)
            else:
                files[head] = e.length
        return sorted(files.items()), sorted(dirs)

    def set_length(self, root: str, path: str, sqn: int, length: int) -> None:
        """The length of a file rebuilt from an index (learnt when first read)."""
        e = self.get(root, path)
        if e is not None and e.sqn == sqn:
            e.length = length

    # -- manifests -----------------------------------------------------------------------
    def manifest(self, root: str) -> dict[str, Any] | None:
        """A snapshot of the root's durable files written by this bridge (None when
        nothing changed since the last one): ``{"format": 3, "root", "bridge", "seq",
        "files": {path: {sqn, length, deleted, segment, older, by}}}``; the shell writes
        it as ``manifest-<bridge>-<seq>.json``, its object URLs relative to the base
        (:func:`manifest_to_store`). Files not yet durable keep their
        previous durable version out of it: a rebuild finds them in the indexes of
        newer objects."""
        rv = self.roots[root]
        if not rv.dirty:
            return None
        files = {
            p: {
                "sqn": e.sqn,
                "length": e.length,
                "deleted": e.deleted,
                "segment": ref.to_dict(),
                "older": sorted(e.older),
                "by": e.by,
            }
            for p, e, ref in self._durable_versions(rv)
            if (e.length >= 0 or e.deleted) and e.by == self.me
        }
        seq = rv.manifest_seq
        rv.manifest_seq += 1
        rv.dirty = False
        return {
            "format": MANIFEST_FORMAT,
            "root": rv.root,
            "bridge": self.me,
            "seq": seq,
            "files": files,
        }

    @staticmethod
    def _durable_versions(rv: RootView) -> list[tuple[str, Entry, SegmentRef]]:
        """Each file's newest durable version and its segment: its entry, or the one a
        write not yet durable replaces."""
        out = []
        for p, e in rv.files.items():
            d = e if e.ref is not None else e.prev
            if d is not None and d.ref is not None:
                out.append((p, d, d.ref))
        return out

    def on_manifest_written(self, root: str, seq: int) -> list[Instruction]:
        """Manifest ``seq`` of ``root`` is durable: objects waiting for it may go."""
        rv = self.roots[root]
        rv.manifest_written = max(rv.manifest_written, seq)
        out: list[Instruction] = []
        for url in list(self.objects):
            out += self._maybe_release(url)
        return out

    # -- objects -------------------------------------------------------------------------
    def _obj(self, url: str) -> ObjectState:
        return self.objects.setdefault(url, ObjectState())

    def _covered(self, obj: ObjectState) -> bool:
        keys = {rv.key: rv for rv in self.roots.values()}
        return all(k in keys and keys[k].manifest_written >= s for k, s in obj.deaths.items())

    def _maybe_release(self, url: str) -> list[Instruction]:
        obj = self.objects.get(url)
        if obj is None or obj.live or obj.asked or not obj.dead or not self._covered(obj):
            return []
        obj.asked = True
        return [ReadIndex(url)]

    def on_index(self, url: str, refs: Iterable[SegmentRef]) -> list[Instruction]:
        """Object ``url``'s index, read for a release: delete it when every segment in
        it is dead here (any other writer's segment keeps it)."""
        obj = self.objects.get(url)
        if obj is None:
            return []
        obj.asked = False
        rows = {(r.log_id, r.sqn_from) for r in refs if not r.meta.is_marker}
        if obj.live or not rows <= obj.dead:
            return []
        return [DeleteObject(url)]

    def on_index_failed(self, url: str) -> None:
        """The index could not be read: the object stays (asked again on a later death)."""
        obj = self.objects.get(url)
        if obj is not None:
            obj.asked = False

    def on_object_deleted(self, url: str) -> list[Instruction]:
        """Object ``url`` is gone: tombstones waiting for it may go too."""
        self.objects.pop(url, None)
        out: list[Instruction] = []
        for rv in self.roots.values():
            for path in [p for p, e in rv.files.items() if e.deleted and url in e.older]:
                rv.files[path].older.discard(url)
                rv.dirty = True
                out += self._prune_tombstone(rv, path)
        return out

    def _prune_tombstone(self, rv: RootView, path: str) -> list[Instruction]:
        e = rv.files.get(path)
        if e is None or not e.deleted or e.ref is None or e.older:
            return []
        del rv.files[path]
        if e.by != self.me:
            return []
        return self._kill(rv, path, e.sqn, e.ref.path)

    # -- orphans -------------------------------------------------------------------------
    def is_orphan(
        self,
        url: str,
        refs: Iterable[SegmentRef],
        shared: Collection[str],
        aged: bool,
        present: Collection[str] | None = None,
    ) -> bool:
        """Whether object ``url`` (its index rows ``refs``) holds nothing any view of its
        queries needs, so the bridge may delete it: a node's copy of a write it was sent
        again (after a silence or a reconnect), or the late copy of a write that fell back
        to the DFS, or a write reported failed that landed anyway. True only when every
        row is of a root this view holds and is dead: its (path, SQN) is no version this
        view holds (every write of a root no other bridge writes, ``shared`` roots
        excepted, is this bridge's, so a write it does not hold was replaced, deleted or
        failed), or that version is durable in another object (a copy). In a ``shared``
        root a row counts only once the object is ``aged``: the other bridges' manifests
        name their files by then, and one that adopted the copy from an index (a miss)
        has read it. A copy counts only when the object holding the version is among
        ``present`` (the objects listed with it; None: no check), so a base path copied
        elsewhere, whose manifests name the original's objects, keeps its own. An object
        this view tracks
        waits for a manifest written after its last death (:meth:`_covered`)."""
        keys = {rv.key: rv for rv in self.roots.values()}
        obj = self.objects.get(url)
        if obj is not None and (obj.live or obj.asked or not self._covered(obj)):
            return False
        ours = False
        for r in refs:
            parsed = parse_log_id(r.log_id)
            if parsed is None or parsed[0] not in keys:
                return False  # another writer's, or a query this bridge does not serve
            if r.meta.is_marker:
                continue
            rv = keys[parsed[0]]
            row = (parsed[1], r.sqn_from, url)
            if not self._row_dead(rv, row, rv.root in shared, aged, present):
                return False
            ours = True
        return ours

    @staticmethod
    def _row_dead(
        rv: RootView,
        row: tuple[str, int, str],
        shared: bool,
        aged: bool,
        present: Collection[str] | None,
    ) -> bool:
        path, sqn, url = row
        e = rv.files.get(path)
        for v in (e, e.prev) if e is not None else ():
            if v is not None and v.sqn == sqn:  # a version held: dead only as a copy
                held = v.ref.path if v.ref is not None else url
                copy = held != url and (present is None or held in present)
                return copy and (aged or not shared)  # another bridge may have found it
        return aged or not shared

    # -- checks --------------------------------------------------------------------------
    def validate(self) -> None:
        """Assert every invariant (tests call it after each step)."""
        for rv in self.roots.values():
            assert rv.key == query_key(rv.root)
            for path, e in rv.files.items():
                assert path and not path.startswith("/") and ".." not in path.split("/"), path
                assert (e.data is None) or e.ref is None, path
                assert not e.deleted or e.length == 0, path
                assert e.data is None or len(e.data) == e.length, path
                assert e.sqn <= self._last_sqn, path
                mine = e.by == self.me
                if mine and (e.ref is not None and not e.deleted or e.ref is not None and e.older):
                    assert (rv.key, path, e.sqn) in self.objects[e.ref.path].live, path
        for url, obj in self.objects.items():
            for key, path, sqn in obj.live:
                (rv,) = [r for r in self.roots.values() if r.key == key]
                e = rv.files[path]
                if e.sqn != sqn and e.prev is not None:
                    e = e.prev  # the durable version a pending write replaces
                assert e.sqn == sqn and e.ref is not None and e.ref.path == url
                assert (log_id(key, path), sqn) not in obj.dead
