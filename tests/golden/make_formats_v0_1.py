"""Writes tests/golden/formats-0.1/: a file of every format dstltree 0.1 persists, written
by this version's own code, so that tests/unit/test_golden_formats.py checks that every
later version still reads them (and refuses them once their version field is bumped).

Run once, from the repository root, at the commit that adds it:
``.venv/bin/python tests/golden/make_formats_v0_1.py``. The files it wrote are
committed and are never regenerated: a later version that changes a format adds a
``formats-<version>/`` folder (and a generator) of its own beside this one.

What it writes (``<base>`` is the job folder; URLs inside checkpoint metadata and bridge
manifests are written relative to ``@BASE@``, which the test replaces by the folder it
copies the files to):

- ``changelog/``: changelog objects of format 1 and of format 2, each holding segments of
  version 1, version 2 and version 2 zstd-compressed. The changes are logged by real
  :class:`KeyedStateBackend` instances whose writers are real :class:`ChangelogWriter`
  instances; every segment of state holds all nine change kinds (value set and clear
  while the writer keeps no last-wins staging, value sets while it does, map put, remove
  and clear, list add, clear and set), every channel-state segment input and output
  batches. Objects are written by ``write_items`` (the function a node and a task's own
  uploader write objects with) at the format version a node's topology would set; this
  version's writer encodes segments of version 2 only, so the version-1 segments are
  re-encoded by ``encode_segment(..., version=1)``, the version-1 encoder still shipped.
- ``materialized/``: a full state snapshot (``KeyedStateBackend.snapshot``, version 2), the
  whole and delta parts of an incremental materialization (``Materializer``, version 3) and
  a split log (``encode_split_log``, as the coordinator's storage worker writes it).
- ``checkpoints/``: commit records (version 4) of checkpoints 1 and 2 (aligned, metadata
  version 3) and 3 and 4 (unaligned, with channel state: metadata version 4), written by
  :class:`CheckpointStore`. Checkpoint 4, the latest, names the full snapshot (task 0), the
  whole and delta parts (task 1), no snapshot (task 2), changelog handles over objects of
  both formats and every segment version, channel state, the split log and committables.
- ``ss/``: Structured Streaming bridge manifests: format 2 (``TreeFiles`` of bridge
  ``golden``, root ``ROOT_2``) and format 1 (root ``ROOT_1``), the latter made by the
  bridge's view as of commit 780bca5^, the last to write format 1 (read with ``git show``).
- ``wire.msgpack``: one msgpack array of the frame lists (``client.wire.dump``) of every
  wire message type.
- ``expected.json``: what a reader gets back from each of them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import typing
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack

from dstltree.client import wire
from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES, ChangelogClient
from dstltree.client.batching import PersistItem
from dstltree.client.direct import write_items
from dstltree.client.futures import SegmentFuture
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.objectformat import FOOTER, FOOTER_SIZE
from dstltree.client.reader import read_index, read_segment
from dstltree.client.segment import (
    SegmentMeta,
    decode_segment,
    encode_segment,
    segment_crc,
    segment_parts,
)
from dstltree.client.writer import DEFAULT_SQUASH_ENTRIES, ChangelogWriter
from dstltree.coordinator.checkpoint import (
    CompletedCheckpoint,
    MaterializedRef,
    SplitLogRef,
    TaskCheckpoint,
)
from dstltree.coordinator.splitlog import SPLIT_LOG_SUFFIX, encode_split_log
from dstltree.coordinator.store import CheckpointStore
from dstltree.sparkplug.channel_state import (
    channel_log_id,
    input_change,
    output_change,
    restore_inflight,
)
from dstltree.sparkplug.exchange import encode_batch
from dstltree.sparkplug.keygroups import key_group_of, key_group_range
from dstltree.sparkplug.materialize import Materializer
from dstltree.sparkplug.restore import restore_all
from dstltree.sparkplug.sinks.layout import Committable, final_name, staged_name
from dstltree.sparkplug.sinks.multipart import UploadPart
from dstltree.sparkplug.sources.base import EnumeratorState, Split, SplitState
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.hedging import HedgedUploader
from dstltree.storage.store import SNAPSHOT_DIR, ObjectStore
from dstltree.structured_streaming.files import TreeFiles
from dstltree.structured_streaming.view import Entry, query_key

OUT = Path(__file__).parent / "formats-0.1"
PLACEHOLDER = "@BASE@"
JOB = "golden"
MAX_P = 12
PARALLELISM = 3
ROOT_2 = "file:/golden/queries/q2/state"  # a bridge root whose manifests are format 2
ROOT_1 = "file:/golden/queries/q1/state"  # ... format 1
FORMAT_1_VIEW = "780bca5^"  # the last commit whose bridge wrote format-1 manifests
# golden files are read byte for byte: never converted; the binary ones never diffed
GITATTRIBUTES = "* -text\n*.dstl binary\n*.snap binary\n*.msgpack binary\n"
FILL = "golden-" * 6  # repeated bytes: a segment body zstd shrinks
# per round: the object format, and the segment flavour of each task's state writer and
# channel-state writer ("v1", "v2", "zstd"); rounds 3 and 4 log channel state
ROUNDS: dict[int, tuple[int, tuple[str, str, str], tuple[str, str, str] | None]] = {
    1: (1, ("v1", "v2", "zstd"), None),
    2: (2, ("v2", "zstd", "v1"), None),
    3: (1, ("zstd", "v1", "v2"), ("v1", "v2", "zstd")),
    4: (2, ("v1", "v2", "zstd"), ("zstd", "v1", "v2")),
}


# what expected.json records of each checkpoint and task beyond state and handles
CHECKPOINT_FIGURES = ("attempt", "created_at", "duration_s", "parallelism", "max_parallelism")
TASK_FIGURES = (
    *("attempt", "records", "key_groups", "sync_s", "async_s", "unaligned"),
    *("alignment_s", "start_delay_s", "inflight_bytes"),
)


def plain(x: Any) -> Any:
    """``x`` as JSON values that keep what JSON would lose: bytes as ``{"bytes": hex}``,
    tuples as ``{"tuple": [...]}``, maps as ``{"map": [[k, v], ...]}`` in their order,
    sets sorted, dataclasses as ``{"dataclass": name, "fields": {...}}``."""
    if isinstance(x, bytes | bytearray | memoryview):
        return {"bytes": bytes(x).hex()}
    if is_dataclass(x) and not isinstance(x, type):
        return {
            "dataclass": type(x).__name__,
            "fields": {f.name: plain(getattr(x, f.name)) for f in fields(x)},
        }
    if isinstance(x, tuple):
        return {"tuple": [plain(v) for v in x]}
    if isinstance(x, list):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {"map": [[plain(k), plain(v)] for k, v in x.items()]}
    if isinstance(x, set | frozenset):
        return sorted(plain(v) for v in x)
    return x


def state_rows(state: dict[str, dict[Any, Any]]) -> dict[str, list[Any]]:
    """``restore_all``'s result as state name -> [[key group, key, state], ...], sorted
    by key group and key."""
    out = {}
    for name, per_key in sorted(state.items()):
        rows = [[key_group_of(k, MAX_P), plain(k), plain(v)] for k, v in per_key.items()]
        out[name] = sorted(rows, key=lambda r: json.dumps(r[:2]))
    return out


class GoldenUploader:
    """A segment uploader that keeps the writers' items until :meth:`flush` writes them
    as one object (``write_items``, format ``version``); the items of logs named in
    ``flavours`` are re-encoded first: ``"v1"`` as segment version 1. ``"zstd"`` and
    ``"v2"`` segments are the writer's own bytes (its ``compression`` decides)."""

    def __init__(self, store: ObjectStore) -> None:
        self.hedged = HedgedUploader(store)
        self.flavours: dict[str, str] = {}
        self.objects: list[str] = []
        self._items: list[tuple[PersistItem, SegmentFuture[SegmentRef | None]]] = []

    def register(self, log_id: str) -> None:
        pass

    def unregister(self, log_id: str) -> None:
        pass

    def submit(self, item: PersistItem) -> SegmentFuture[SegmentRef | None]:
        fut: SegmentFuture[SegmentRef | None] = SegmentFuture()
        if item.data is None:
            fut.set_result(None)
        else:
            self._items.append((item, fut))
        return fut

    def flush(self, version: int) -> str:
        """Write the items kept as one object of format ``version``; its URL."""
        items = [self._flavoured(i) for i, _ in self._items]
        path, refs = write_items(self.hedged, items, version, writer="golden-node")
        for (_, fut), ref in zip(self._items, refs, strict=True):
            fut.set_result(ref)
        self._items = []
        self.objects.append(path)
        return path

    def _flavoured(self, item: PersistItem) -> PersistItem:
        if self.flavours.get(item.meta.log_id) != "v1":
            return item
        assert item.data is not None
        seg = decode_segment(b"".join(bytes(p) for p in segment_parts(item.data)))
        changesets: dict[int, dict[int, list[bytes]]] = {}
        for (sqn, kg), changes in seg.entries.items():
            changesets.setdefault(sqn, {})[kg] = changes
        data = encode_segment(seg.log_id, seg.sqn_from, seg.sqn_to, changesets, version=1)
        m = item.meta
        meta = SegmentMeta(
            m.log_id, m.sqn_from, m.sqn_to, m.key_groups, len(data), segment_crc(data)
        )
        return PersistItem(meta, item.checkpoint_id, data)

    def close(self) -> None:
        pass


@dataclass
class Task:
    """One task of the golden job: its backend, writers and what its next checkpoint
    acknowledges."""

    index: int
    backend: KeyedStateBackend
    writer: ChangelogWriter
    keys: list[Any]
    materialized: MaterializedRef | None = None
    after: int = 0
    channels: ChangelogWriter | None = None
    cs_after: int = 0

    @property
    def key_groups(self) -> range:
        return self.backend.key_groups


def _keys(kgs: range) -> list[Any]:
    """Seven keys of the key groups ``kgs``: five strings, an int and a tuple."""
    pools = [
        (f"user-{i}" for i in itertools.count()),
        iter(range(10**6)),
        (("acct", i) for i in itertools.count()),
    ]
    out: list[Any] = []
    for pool, n in zip(pools, (5, 1, 1), strict=True):
        out += list(itertools.islice((k for k in pool if key_group_of(k, MAX_P) in kgs), n))
    return out


def _round(t: Task, r: int) -> None:
    """Round ``r`` of task ``t``'s state updates: every change kind once at least."""
    b, w, k = t.backend, t.writer, t.keys
    w.squash_entries = 0  # no last-wins staging: value set / clear changes
    b.writer = w
    count = b.value_state("count")
    b.set_current_key(k[0])
    count.set({"round": r, "fill": FILL, "raw": b"\x00\xff", "half": 0.5, "none": None})
    b.set_current_key(k[1])
    count.set(r)
    count.clear()
    if r == 1:
        b.set_current_key(k[6])
        count.set(["written", "once", True, -(2**40)])
    b.flush_changes()
    w.squash_entries = DEFAULT_SQUASH_ENTRIES  # last-wins staging: value sets
    b.writer = w
    last = b.value_state("last")
    b.set_current_key(k[2])
    last.set(f"{FILL}{r}")
    b.set_current_key(k[3])
    last.set(r)
    if r % 2 == 0:
        last.clear()
    seen = b.map_state("seen")
    b.set_current_key(k[4])
    seen.put(f"u{r}", {"at": r, "fill": FILL})
    seen.put(("pair", r), [r, r + 1])
    seen.remove(f"u{r - 1}")
    b.set_current_key(k[5])
    seen.put("gone", r)
    seen.clear()
    events = b.list_state("events")
    b.set_current_key(k[0])
    events.add(f"{FILL}e{r}")
    b.set_current_key(k[2])
    events.add(r)
    events.clear()
    events.add(-r)
    b.set_current_key(k[3])
    events.update([r, f"{FILL}u{r}", None])


def _log_channel_state(t: Task, r: int, all_keys: list[Any]) -> int:
    """Round ``r``'s in-flight batches of task ``t``: an input and an output batch
    (records of any task's keys); returns the bytes logged."""
    assert t.channels is not None
    start = t.key_groups.start
    pick = [all_keys[(t.index * 5 + r + i) % len(all_keys)] for i in range(3)]
    logged = 0
    for make, tag in ((input_change, "in"), (output_change, "out")):
        items = [(key, {"tag": f"{tag}-{r}", "n": i, "fill": FILL}) for i, key in enumerate(pick)]
        change = make(encode_batch(items))
        t.channels.append(start, change)
        logged += len(change)
    return logged


def _persist(
    tasks: list[Task], up: GoldenUploader, r: int, cp: int
) -> tuple[dict[int, ChangelogHandle], dict[int, ChangelogHandle]]:
    """Persist every writer for checkpoint ``cp`` as one object of round ``r``'s format;
    the state and channel-state handles per task."""
    version, flavours, cs_flavours = ROUNDS[r]
    futures, cs_futures = {}, {}
    for t in tasks:
        up.flavours[t.writer.log_id] = flavours[t.index]
        t.writer.compression = "zstd" if flavours[t.index] == "zstd" else None
        futures[t.index] = t.writer.persist_durably(t.after, checkpoint_id=cp)
        if t.channels is not None and cs_flavours is not None:
            up.flavours[t.channels.log_id] = cs_flavours[t.index]
            t.channels.compression = "zstd" if cs_flavours[t.index] == "zstd" else None
            cs_futures[t.index] = t.channels.persist_durably(t.cs_after, checkpoint_id=cp)
    up.flush(version)
    handles = {i: f.result() for i, f in futures.items()}
    cs_handles = {i: f.result() for i, f in cs_futures.items()}
    for t in tasks:
        if t.index in cs_handles and t.channels is not None:
            t.cs_after = cs_handles[t.index].sqn_range[1]
            t.channels.truncate(t.cs_after)
    return handles, cs_handles


def _full_snapshot(store: ObjectStore, t: Task) -> None:
    """Materialize task ``t`` as one full snapshot (version 2)."""
    sqn = t.writer.next_sqn()
    data = t.backend.snapshot()
    path = store.new_snapshot_path()
    store.put(path, data)
    t.materialized = MaterializedRef(path, sqn, len(data))
    t.after = sqn
    t.writer.truncate(sqn)


def _incremental(m: Materializer, t: Task, epoch: int) -> None:
    """Materialize task ``t`` incrementally (whole parts first, delta parts after)."""
    ref = m.run_now(epoch)
    t.materialized = ref
    t.after = ref.sqn
    t.writer.truncate(ref.sqn)


def _enumerator(cp: int) -> EnumeratorState:
    """The split enumerator at checkpoint ``cp``: ``cp`` files finished, one assigned
    (with its reader's offset folded in), one pending."""
    split = Split(f"f-{cp:04d}.parquet", f"landing/f-{cp:04d}.parquet")
    nxt = Split(f"f-{cp + 1:04d}.parquet", f"landing/f-{cp + 1:04d}.parquet")
    return EnumeratorState(
        pending=(SplitState(nxt, 0),),
        assigned={split.id: (cp % PARALLELISM, SplitState(split, 10 * cp))},
        finished=frozenset(f"f-{i:04d}.parquet" for i in range(cp)),
        complete=False,
    )


def _committables(cp: int) -> dict[int, tuple[Committable, ...]]:
    """A staged-file committable (task 0) and a multipart one (task 1) of ``cp``."""
    staged = Committable(
        cp,
        0,
        0,
        staged_name(cp, 0, 0, "parquet", "0" * 32),
        final_name(cp, 0, 0, "parquet"),
        3,
        1234,
    )
    multipart = Committable(
        cp,
        1,
        0,
        staged_name(cp, 1, 0, "parquet", "1" * 32),
        final_name(cp, 1, 0, "parquet"),
        5,
        2345,
        upload_id="golden-upload-1",
        parts=(UploadPart(1, '"etag-1"', 2345),),
    )
    return {0: (staged,), 1: (multipart,)}


def _checkpoint(
    cp: int,
    tasks: list[Task],
    handles: dict[int, ChangelogHandle],
    cs: dict[int, ChangelogHandle],
    extra: dict[str, Any],
) -> CompletedCheckpoint:
    """Checkpoint ``cp`` of ``tasks``; ``extra``: epoch, finished_log, inflight bytes per
    task, committables."""
    inflight = extra.get("inflight", {})
    committables = extra.get("committables", {})
    out = {
        t.index: TaskCheckpoint(
            task=t.index,
            attempt=0,
            records=100 * cp + t.index,
            materialized=t.materialized,
            changelog=(handles[t.index],),
            key_groups=(t.key_groups.start, t.key_groups.stop),
            committables=committables.get(t.index, ()),
            sync_s=0.001 * (t.index + 1),
            async_s=0.01 * cp,
            channel_state=(cs[t.index],) if t.index in cs else (),
            unaligned=t.index in cs,
            alignment_s=0.002 * cp if t.index in cs else 0.0,
            start_delay_s=0.003 if t.index in cs else 0.0,
            inflight_bytes=inflight.get(t.index, 0),
        )
        for t in tasks
    }
    return CompletedCheckpoint(
        checkpoint_id=cp,
        attempt=0,
        materialization_epoch=extra.get("epoch", 0),
        created_at=1_800_000_000.0 + cp,
        duration_s=0.25,
        tasks=out,
        parallelism=PARALLELISM,
        max_parallelism=MAX_P,
        enumerator=_enumerator(cp),
        finished_log=extra.get("finished_log"),
    )


def _live_state(tasks: list[Task]) -> dict[str, dict[Any, Any]]:
    """Every task's state now, as ``restore_all`` returns a checkpoint's."""
    out: dict[str, dict[Any, Any]] = {}
    for t in tasks:
        for name in t.backend.state_names():
            out.setdefault(name, {}).update(t.backend.items(name))
    return out


def _write_split_log(store: ObjectStore, ids: frozenset[str]) -> SplitLogRef:
    """The split log of ``ids``, as the coordinator's storage worker writes it."""
    oid = "5" * 32
    path = store.join(SNAPSHOT_DIR, oid[:2], f"{oid}{SPLIT_LOG_SUFFIX}")
    store.put(path, encode_split_log(ids))
    return SplitLogRef(path, len(ids), ids)


def _job(store: ObjectStore, up: GoldenUploader) -> dict[str, Any]:
    """Run the golden job: four checkpoints committed; returns the expected state per
    checkpoint (the live state at each) and the in-flight records."""
    client = ChangelogClient(store, up, DEFAULT_PREEMPTIVE_BYTES)
    tasks = []
    for i in range(PARALLELISM):
        kgs = key_group_range(i, PARALLELISM, MAX_P)
        w = client.create_writer(f"{JOB}-t{i}-a0", kgs)
        tasks.append(Task(i, KeyedStateBackend(kgs, w, MAX_P), w, _keys(kgs)))
    all_keys = [k for t in tasks for k in t.keys]
    cps = CheckpointStore(store, owner="golden-driver")
    cps.claim()
    states: dict[str, Any] = {}
    materializer = Materializer(store, tasks[1].backend, target_bytes=256)
    extra: dict[str, Any] = {}
    for r in ROUNDS:
        for t in tasks:
            _round(t, r)
        inflight = {}
        if ROUNDS[r][2] is not None:
            for t in tasks:
                if t.channels is None:
                    t.channels = client.create_writer(channel_log_id(t.writer.log_id), t.key_groups)
                inflight[t.index] = _log_channel_state(t, r, all_keys)
        handles, cs = _persist(tasks, up, r, r)
        extra.update(inflight=inflight, committables=_committables(r) if r == 4 else {})
        cps.add(_checkpoint(r, tasks, handles, cs, extra))
        states[str(r)] = _live_state(tasks)
        if r == 1:
            _full_snapshot(store, tasks[0])
            _incremental(materializer, tasks[1], 1)
            extra["epoch"] = 1
        elif r == 2:
            _incremental(materializer, tasks[1], 2)
            extra.update(epoch=2, finished_log=_write_split_log(store, _enumerator(2).finished))
    materializer.close()
    client.close()
    return states


def _segment_header(data: bytes) -> dict[str, Any]:
    hlen = int.from_bytes(data[:4], "big")
    header: dict[str, Any] = msgpack.unpackb(data[4 : 4 + hlen])
    return header


def _objects(store: ObjectStore, urls: list[str], rel: Any) -> dict[str, Any]:
    """Per object (path relative to the job folder): its format version and segments,
    each with its header's version and codec and every change, read back."""
    out = {}
    for url in urls:
        raw = store.read(url)
        version = FOOTER.unpack(raw[-FOOTER_SIZE:])[1]
        segments = []
        for ref in read_index(store, url, verify=True):
            data = raw[ref.offset : ref.offset + ref.length]
            header = _segment_header(data)
            seg = read_segment(store, ref, ref.log_id)
            segments.append(
                {
                    "log": ref.log_id,
                    "sqn": [ref.sqn_from, ref.sqn_to],
                    "key_groups": list(ref.key_groups),
                    "offset": ref.offset,
                    "length": ref.length,
                    "crc32": ref.crc32,
                    "version": header["v"],
                    "codec": header.get("codec"),
                    "changes": [
                        [sqn, kg, bytes(c).hex()]
                        for sqn, kg, c in seg.key_group_changes(0, 1 << 62)
                    ],
                }
            )
        out[rel(url)] = {"format": version, "segments": segments}
    return out


def _handles(cp: CompletedCheckpoint, rel: Any) -> dict[str, Any]:
    """Per task: its snapshot files and its handles (log, SQN range, segment refs)."""

    def handle(h: ChangelogHandle) -> dict[str, Any]:
        segs = [[rel(s.path), s.offset] for s in h.segments]
        return {"log": h.log_id, "sqn": list(h.sqn_range), "segments": segs}

    out = {}
    for i, tc in sorted(cp.tasks.items()):
        mat = tc.materialized
        out[str(i)] = {
            "snapshot": None
            if mat is None
            else {
                "sqn": mat.sqn,
                "files": [[rel(p.path), p.delta] for p in mat.parts] or [[rel(mat.path), None]],
            },
            "changelog": [handle(h) for h in tc.changelog],
            "channel_state": [handle(h) for h in tc.channel_state],
            "figures": {k: plain(getattr(tc, k)) for k in TASK_FIGURES},
        }
    return out


def _checkpoints(store: ObjectStore, states: dict[str, Any], rel: Any) -> dict[str, Any]:
    """What the checkpoint store reads back, checked against the live job: every retained
    checkpoint's state restores to what the tasks held."""
    cs = CheckpointStore(store)
    retained = cs.list_retained()
    out: dict[str, Any] = {
        "retained": [c.checkpoint_id for c in retained],
        "latest": cs.latest_id(),
        "checkpoints": {},
    }
    for cp in retained:
        restored = restore_all(store, cp, MAX_P)
        assert state_rows(restored) == state_rows(states[str(cp.checkpoint_id)]), cp
        inflight = restore_inflight(store, cp, range(MAX_P))
        assert cp.enumerator is not None
        out["checkpoints"][str(cp.checkpoint_id)] = {
            "unaligned": any(t.unaligned for t in cp.tasks.values()),
            "materialization_epoch": cp.materialization_epoch,
            "state": state_rows(restored),
            "inflight": [[plain(k), plain(v)] for k, v in inflight.records],
            "tasks": _handles(cp, rel),
            "finished": sorted(cp.enumerator.finished),
            "finished_log": None
            if cp.finished_log is None
            else [rel(cp.finished_log.path), sorted(cp.finished_log.ids or ())],
            "committables": [plain(c) for c in cp.committables()],
            "figures": {k: plain(getattr(cp, k)) for k in CHECKPOINT_FIGURES},
            "enumerator": plain(cp.enumerator),
        }
    return out


def _old_view_module() -> ModuleType:
    """structured_streaming/view.py as of FORMAT_1_VIEW (writes format-1 manifests)."""
    source = subprocess.run(
        ["git", "show", f"{FORMAT_1_VIEW}:structured_streaming/view.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_view.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("golden_old_view", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _bridge_writes(files: TreeFiles, root: str, up: GoldenUploader) -> list[tuple[str, Entry]]:
    """State files of ``root`` written, rewritten and deleted through ``files``, each
    persisted as its own object; (path, its entry once durable) of every write in order."""
    done = []
    ops: list[tuple[str, bytes | None]] = [
        ("state/0/0/1.delta", b"delta-1 " + FILL.encode()),
        ("state/0/0/2.delta", b"delta-2 " + FILL.encode()),
        ("state/0/1/1.delta", b"first version"),
        ("state/0/0/_metadata/schema", b"schema"),
        ("state/0/1/1.delta", b"second version " + FILL.encode()),
        ("state/0/0/2.delta", None),  # deleted: a tombstone
    ]
    for path, data in ops:
        if data is None:
            assert files.delete(root, path)
        else:
            files.reserve(len(data))
            files.put(root, path, data)
        up.flush(1)
        entry = files.view.roots[root].files[path]
        assert entry.ref is not None
        done.append((path, replace(entry)))
    return done


def _manifests(store: ObjectStore, client: ChangelogClient, up: GoldenUploader) -> None:
    """Bridge manifests: format 2 of ``ROOT_2`` (bridge ``golden``), format 1 of
    ``ROOT_1`` (the view of FORMAT_1_VIEW fed the same events as this one's)."""
    clock = itertools.count(1_800_000_000)
    files = TreeFiles(client, bridge_id="golden", clock=lambda: float(next(clock)))
    _bridge_writes(files, ROOT_2, up)
    files.housekeep()
    lone = TreeFiles(client, bridge_id="", clock=lambda: float(next(clock)))
    old = _old_view_module().View()
    old.on_loaded(ROOT_1, None, [])
    for path, entry in _bridge_writes(lone, ROOT_1, up):
        if entry.deleted:
            old.on_delete(ROOT_1, path, entry.sqn)
        else:
            old.on_accepted(ROOT_1, path, b"?" * entry.length, entry.sqn)
        old.on_durable(ROOT_1, path, entry.sqn, entry.ref)
    doc = old.manifest(ROOT_1)
    assert doc is not None and doc["format"] == 1
    url = f"{store.join('ss', query_key(ROOT_1))}/manifest-{doc['seq']}.json"
    store.put(url, json.dumps(doc, separators=(",", ":")).encode())


def _bridge_expected(store: ObjectStore, rel: Any) -> dict[str, Any]:
    """Per root: its manifests' format, and each live file's bytes and each deleted
    file, as a bridge rebuilt from them serves them."""
    out = {}
    client = ChangelogClient(store, GoldenUploader(store), DEFAULT_PREEMPTIVE_BYTES)
    for root, bridge, fmt in ((ROOT_2, "golden", 2), (ROOT_1, "", 1)):
        files = TreeFiles(client, bridge_id=bridge)
        files.ensure(root)
        rv = files.view.roots[root]
        live = {
            p: files.read(root, p, 0, 1 << 20).hex() for p, e in rv.files.items() if not e.deleted
        }
        manifests = sorted(rel(u) for u in store.list_files(files.manifest_dir(root)))
        out[root] = {
            "bridge": bridge,
            "format": fmt,
            "manifests": manifests,
            "entries": {p: _entry(e, rel) for p, e in sorted(rv.files.items())},
            "files": dict(sorted(live.items())),
            "deleted": sorted(p for p, e in rv.files.items() if e.deleted),
        }
    client.close()
    return out


def _entry(e: Entry, rel: Any) -> dict[str, Any]:
    """A bridge view's entry of a file: its write, length, writer and segment."""
    assert e.ref is not None
    segment = [rel(e.ref.path), e.ref.offset, e.ref.sqn_from]
    return {"sqn": e.sqn, "length": e.length, "deleted": e.deleted, "by": e.by, "segment": segment}


def _sample_messages(segment: bytes) -> list[wire.Message]:
    """One message of every wire type (several shapes of some)."""
    meta = SegmentMeta(f"{JOB}-t0-a0", 3, 5, (0, 2), len(segment), segment_crc(segment))
    persist = (
        wire.PersistRequest(1, PersistItem(meta, 4, segment)),
        wire.PersistRequest(2, PersistItem.marker(f"{JOB}-t1-a0", 7, 4)),
        wire.PersistRequest(3, PersistItem.summary("node-b", 4, 3)),
    )
    return [
        wire.Register(f"{JOB}-t0-a0"),
        wire.Unregister(f"{JOB}-t0-a0"),
        wire.Persist(persist[:2]),
        wire.Persist(persist, via="node-b"),
        wire.PersistAck(
            (
                wire.AckEntry(1, "s3://bucket/job/changelog/0a/obj.dstl", 128),
                wire.AckEntry(2, error="x"),
            )
        ),
        wire.Stats("node-b", 4, 1024.5, 4, 2),
        wire.Stats("node-c", 0),
        wire.Plan(3, "node-a", "tcp://10.0.0.1:7001", (("node-a", "tcp://10.0.0.1:7001"),)),
        wire.Error("unknown message type 'x'"),
        *_version_2_messages(),
    ]


def _version_2_messages() -> list[wire.Message]:
    """Hello, ping and pong, if this version's wire has them."""
    names = {t.__name__ for t in typing.get_args(wire.Message)}
    out: list[wire.Message] = []
    if {"WireHello", "Ping", "Pong"} <= names:
        hello, ping, pong = (getattr(wire, n) for n in ("WireHello", "Ping", "Pong"))
        out += [hello((1, 2)), hello((2,), "node-a"), ping(7), pong(7)]
    return out


def _wire(first_segment: bytes) -> tuple[bytes, list[Any]]:
    """The frame lists of every sample message (one msgpack array) and each message as
    loaded back."""
    messages = _sample_messages(first_segment)
    types = {type(m) for m in messages}
    assert types == set(typing.get_args(wire.Message)), "a wire message type has no sample"
    frames = [[bytes(f) for f in wire.dump(m)] for m in messages]
    loaded = [wire.load(f) for f in frames]
    assert loaded == messages
    blob: bytes = msgpack.packb(frames)
    return blob, [plain(m) for m in loaded]


def _copy_out(base: Path, prefix: str) -> None:
    """Copy the job folder to OUT, its URLs in checkpoints and manifests made
    ``@BASE@``-relative."""
    if OUT.exists():
        shutil.rmtree(OUT)
    for f in sorted(base.rglob("*")):
        if not f.is_file() or f.stat().st_size == 0:
            continue
        dest = OUT / f.relative_to(base)
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = f.read_bytes()
        if f.suffix == ".json":
            data = data.replace(prefix.encode(), PLACEHOLDER.encode())
        dest.write_bytes(data)
    (OUT / ".gitattributes").write_text(GITATTRIBUTES)


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    base = tmp / "job"
    store = ObjectStore(str(base))
    up = GoldenUploader(store)
    states = _job(store, up)
    state_objects = list(up.objects)
    client = ChangelogClient(store, up, DEFAULT_PREEMPTIVE_BYTES)
    _manifests(store, client, up)
    prefix = store.base_url.rstrip("/")

    def rel(url: str) -> str:
        assert url.startswith(prefix + "/"), url
        return url[len(prefix) + 1 :]

    objects = _objects(store, sorted(store.list_files(store.changelog_root())), rel)
    first = objects[rel(state_objects[0])]["segments"][0]
    segment = store.read(state_objects[0])[first["offset"] : first["offset"] + first["length"]]
    blob, messages = _wire(segment)
    (base / "wire.msgpack").write_bytes(blob)
    expected = {
        "max_parallelism": MAX_P,
        "objects": objects,
        **_checkpoints(store, states, rel),
        "bridge": _bridge_expected(store, rel),
        "wire": messages,
    }
    client.close()
    _copy_out(base, prefix)
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(tmp)
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT} ({size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
