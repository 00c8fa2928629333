"""Golden files of every format dstltree 0.1 persists (tests/golden/formats-0.1/,
written once by tests/golden/make_formats_v0_1.py): this version reads each of them back
exactly as ``expected.json`` says, and refuses a copy whose version field names an
unknown, future version (99) with an error naming the file and the version, never
misreading it.

Every later version runs this test unchanged against the same files: NEVER regenerate
formats-0.1/ nor edit expected.json to make a failure go away (that is the failure this
test exists to catch). A version that changes a format keeps reading this folder and
adds a ``formats-<version>/`` folder of its own (with its generator);
``test_every_version_written_today_has_a_golden_file`` fails until it does.
"""

from __future__ import annotations

import json
import shutil
import struct
import typing
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest

from dstltree.aggregator.core import NodeConfig, NodeCore
from dstltree.aggregator.events import MalformedFromBelow, MessageFromBelow, ReplyBelow
from dstltree.client import wire
from dstltree.client.api import ChangelogClient
from dstltree.client.errors import CorruptObjectError, UnsupportedVersionError, WireError
from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.objectformat import FOOTER, FOOTER_SIZE, FORMAT_VERSIONS, build_object
from dstltree.client.reader import iter_changes, read_index, read_segment
from dstltree.client.segment import SEGMENT_VERSIONS, SegmentMeta, encode_segment, segment_crc
from dstltree.coordinator import splitlog
from dstltree.coordinator.checkpoint import (
    METADATA_VERSION,
    METADATA_VERSION_ALIGNED,
    CompletedCheckpoint,
    TaskCheckpoint,
)
from dstltree.coordinator.errors import CorruptCheckpointError
from dstltree.coordinator.store import RECORD_VERSION, CheckpointStore
from dstltree.sparkplug import state_backend
from dstltree.sparkplug.channel_state import INPUT, OUTPUT, restore_inflight
from dstltree.sparkplug.exchange import ExchangeError
from dstltree.sparkplug.keygroups import key_group_of, key_group_range
from dstltree.sparkplug.restore import restore_key_groups
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.store import ObjectStore
from dstltree.structured_streaming.files import TreeFiles
from dstltree.structured_streaming.view import MANIFEST_FORMAT, Entry
from dstltree.structured_streaming.wire import WireError as BridgeWireError

GOLDEN = Path(__file__).parent.parent / "golden"
FOLDER = GOLDEN / "formats-0.1"
PLACEHOLDER = b"@BASE@"
FUTURE = 99  # a version no dstltree has written
ALL_OPS = set(range(9))  # OP_VALUE_SET .. OP_VALUE_SETS
HELLO = {"t": "hello", "v": [1, 2]}  # a writer's hello in wire.msgpack


@dataclass
class Job:
    """The golden folder copied to ``root`` (its ``@BASE@`` URLs pointing there)."""

    root: Path
    store: ObjectStore
    expected: dict[str, Any]

    def url(self, rel: str) -> str:
        return self.store.join(rel)

    def rel(self, url: str) -> str:
        return url[len(self.store.base_url.rstrip("/")) + 1 :]


def _copy(folder: Path, dest: Path) -> Job:
    shutil.copytree(folder, dest)
    store = ObjectStore(str(dest))
    base = store.base_url.rstrip("/").encode()
    for f in dest.rglob("*.json"):
        if f.name != "expected.json":
            f.write_bytes(f.read_bytes().replace(PLACEHOLDER, base))
    return Job(dest, store, json.loads((dest / "expected.json").read_text()))


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return _copy(FOLDER, tmp_path / "job")


def plain(x: Any) -> Any:
    """``x`` as expected.json writes values: bytes as ``{"bytes": hex}``, tuples as
    ``{"tuple": [...]}``, maps as ``{"map": [[k, v], ...]}`` in their order, sets sorted,
    dataclasses as ``{"dataclass": name, "fields": {...}}``."""
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


def _agrees(got: Any, want: Any) -> bool:
    """Whether ``got`` (:func:`plain` of what this version reads) holds ``want`` (from
    expected.json): a dataclass may have fields beyond those ``want`` names (added by a
    later version, with defaults), and a tuple may be a list; all else is equal."""
    if isinstance(want, dict) and "dataclass" in want:
        if not isinstance(got, dict) or got.get("dataclass") != want["dataclass"]:
            return False
        have = got["fields"]
        return all(k in have and _agrees(have[k], v) for k, v in want["fields"].items())
    want, got = (
        x["tuple"] if isinstance(x, dict) and set(x) == {"tuple"} else x for x in (want, got)
    )
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_agrees, got, want))
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(_agrees(got[k], v) for k, v in want.items())
        )
    return bool(got == want) and isinstance(got, bool) == isinstance(want, bool)


def _assert_agrees(got: Any, want: Any) -> None:
    assert _agrees(got, want), f"read {json.dumps(got)}\nexpected {json.dumps(want)}"


def state_rows(backend: KeyedStateBackend) -> dict[str, list[Any]]:
    """The backend's state as state name -> [[key group, key, state], ...], sorted."""
    out = {}
    max_p = backend.max_parallelism
    for name in backend.state_names():
        rows = [[key_group_of(k, max_p), plain(k), plain(v)] for k, v in backend.items(name)]
        out[name] = sorted(rows, key=lambda r: json.dumps(r[:2]))
    return out


def _segment_header(data: bytes) -> dict[str, Any]:
    (hlen,) = struct.unpack_from("!I", data)
    header: dict[str, Any] = msgpack.unpackb(data[4 : 4 + hlen])
    return header


def _is_channel_log(log: str) -> bool:
    return log.endswith("-cs")


# -- reading every file back ---------------------------------------------------------------


def test_every_object_and_segment_reads_back(job: Job) -> None:
    assert job.expected["objects"]
    for rel, want in job.expected["objects"].items():
        url = job.url(rel)
        raw = (job.root / rel).read_bytes()
        assert FOOTER.unpack(raw[-FOOTER_SIZE:])[1] == want["format"]
        refs = read_index(job.store, url, verify=True)
        assert len(refs) == len(want["segments"])
        for ref, seg in zip(refs, want["segments"], strict=True):
            got = (ref.log_id, [ref.sqn_from, ref.sqn_to], list(ref.key_groups))
            assert got == (seg["log"], seg["sqn"], seg["key_groups"])
            assert (ref.offset, ref.length, ref.crc32) == (
                seg["offset"],
                seg["length"],
                seg["crc32"],
            )
            header = _segment_header(raw[ref.offset : ref.offset + ref.length])
            assert (header["v"], header.get("codec")) == (seg["version"], seg["codec"])
            decoded = read_segment(job.store, ref, ref.log_id)
            changes = [
                [s, kg, bytes(c).hex()] for s, kg, c in decoded.key_group_changes(0, 1 << 62)
            ]
            assert changes == seg["changes"]


def test_the_objects_hold_every_segment_version_and_change_kind(job: Job) -> None:
    """What the folder claims to freeze: in objects of both formats, segments of every
    version (uncompressed and compressed), every state segment holding all nine change
    kinds, channel-state segments both kinds."""
    flavours: dict[int, set[tuple[int, str | None]]] = {}
    channel_kinds: set[bytes] = set()
    for obj in job.expected["objects"].values():
        for seg in obj["segments"]:
            flavours.setdefault(obj["format"], set()).add((seg["version"], seg["codec"]))
            changes = [bytes.fromhex(c) for _, _, c in seg["changes"]]
            if _is_channel_log(seg["log"]):
                channel_kinds |= {c[:1] for c in changes}
            elif seg["log"].startswith("golden-t"):
                assert {msgpack.unpackb(c)[0] for c in changes} == ALL_OPS, seg["log"]
    want = {(1, None), (2, None), (2, "zstd")}
    assert all(want <= flavours.get(v, set()) for v in FORMAT_VERSIONS)
    assert channel_kinds == {INPUT, OUTPUT}


def _backend(max_p: int, kgs: range | None = None) -> KeyedStateBackend:
    return KeyedStateBackend(range(max_p) if kgs is None else kgs, None, max_p)


@pytest.mark.parametrize("squash", [True, False])
def test_every_retained_checkpoint_restores(job: Job, squash: bool) -> None:
    cs = CheckpointStore(job.store)
    retained = cs.list_retained()
    assert [c.checkpoint_id for c in retained] == job.expected["retained"]
    assert cs.latest_id() == job.expected["latest"]
    max_p = job.expected["max_parallelism"]
    for cp in retained:
        want = job.expected["checkpoints"][str(cp.checkpoint_id)]
        backend = _backend(max_p)
        restore_key_groups(job.store, cp, backend, squash=squash)
        assert state_rows(backend) == want["state"]
        inflight = restore_inflight(job.store, cp, range(max_p)).records
        assert [[plain(k), plain(v)] for k, v in inflight] == want["inflight"]
        assert any(t.unaligned for t in cp.tasks.values()) == want["unaligned"]
        assert cp.materialization_epoch == want["materialization_epoch"]


def test_a_rescaled_restore_of_the_latest_checkpoint_gets_the_same_state(job: Job) -> None:
    latest = CheckpointStore(job.store).load_latest()
    assert latest is not None
    max_p = job.expected["max_parallelism"]
    merged: dict[str, list[Any]] = {}
    for task in range(4):  # written by 3 tasks
        backend = _backend(max_p, key_group_range(task, 4, max_p))
        restore_key_groups(job.store, latest, backend)
        for name, rows in state_rows(backend).items():
            merged.setdefault(name, []).extend(rows)
    want = job.expected["checkpoints"][str(latest.checkpoint_id)]["state"]
    assert {k: sorted(v, key=json.dumps) for k, v in merged.items()} == {
        k: sorted(v, key=json.dumps) for k, v in want.items()
    }


def _expected_changes(job: Job, handle: dict[str, Any]) -> list[list[Any]]:
    """The changes of an expected handle: its segments' changes within its SQN range."""
    lo, hi = handle["sqn"]
    out = []
    for rel, offset in handle["segments"]:
        (seg,) = [s for s in job.expected["objects"][rel]["segments"] if s["offset"] == offset]
        out += [c for c in seg["changes"] if lo <= c[0] < hi]
    return out


def _check_handles(job: Job, got: tuple[ChangelogHandle, ...], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for h, w in zip(got, want, strict=True):
        assert (h.log_id, list(h.sqn_range)) == (w["log"], w["sqn"])
        assert [[job.rel(s.path), s.offset] for s in h.segments] == w["segments"]
        changes = [[s, kg, bytes(c).hex()] for s, kg, c in iter_changes(job.store, h)]
        assert changes == _expected_changes(job, w)


def test_checkpoint_metadata_reads_back(job: Job) -> None:
    """Snapshots, handles, channel state, splits and committables of every checkpoint."""
    for cp in CheckpointStore(job.store).list_retained():
        want = job.expected["checkpoints"][str(cp.checkpoint_id)]
        assert cp.enumerator is not None
        assert sorted(cp.enumerator.finished) == want["finished"]
        log = cp.finished_log
        assert (None if log is None else [job.rel(log.path), sorted(log.ids or ())]) == want[
            "finished_log"
        ]
        _assert_agrees([plain(c) for c in cp.committables()], want["committables"])
        _assert_agrees(plain(cp.enumerator), want["enumerator"])
        _assert_agrees({k: plain(getattr(cp, k)) for k in want["figures"]}, want["figures"])
        for i, tc in cp.tasks.items():
            task = want["tasks"][str(i)]
            mat = tc.materialized
            if mat is None:
                assert task["snapshot"] is None
            else:
                files = [[job.rel(p.path), p.delta] for p in mat.parts] or [
                    [job.rel(mat.path), None]
                ]
                assert {"sqn": mat.sqn, "files": files} == task["snapshot"]
            _check_handles(job, tc.changelog, task["changelog"])
            _assert_agrees({k: plain(getattr(tc, k)) for k in task["figures"]}, task["figures"])
            _check_handles(job, tc.channel_state, task["channel_state"])


def _tree_files(job: Job, bridge: str) -> TreeFiles:
    return TreeFiles(ChangelogClient.open(str(job.root), node=None), bridge_id=bridge)


def _entry(job: Job, e: Entry) -> dict[str, Any]:
    assert e.ref is not None
    segment = [job.rel(e.ref.path), e.ref.offset, e.ref.sqn_from]
    return {"sqn": e.sqn, "length": e.length, "deleted": e.deleted, "by": e.by, "segment": segment}


def test_bridge_manifests_rebuild_the_files(job: Job) -> None:
    for root, want in job.expected["bridge"].items():
        files = _tree_files(job, want["bridge"])
        try:
            files.ensure(root)
            rv = files.view.roots[root]
            live = {
                p: files.read(root, p, 0, 1 << 20).hex()
                for p, e in rv.files.items()
                if not e.deleted
            }
            assert live == want["files"]
            entries = {p: _entry(job, e) for p, e in sorted(rv.files.items())}
            assert entries == want["entries"]
            assert sorted(p for p, e in rv.files.items() if e.deleted) == want["deleted"]
            for path in want["deleted"]:
                assert files.stat(root, path) is None
        finally:
            files.client.close()


def test_a_manifest_naming_objects_relative_to_the_base_restores_the_same_files(
    tmp_path: Path,
) -> None:
    """formats-0.3's format-3 manifest (objects relative to the base) in place of
    formats-0.1's format-2 one of the same root, in a folder of another name: the same
    files, entries and tombstones."""
    job = _copy(FOLDER, tmp_path / "copied-elsewhere")
    relative = GOLDEN / "formats-0.3" / "ss"
    for folder in relative.iterdir():
        for old in (job.root / "ss" / folder.name).glob("manifest-*.json"):
            old.unlink()
        for f in folder.iterdir():
            shutil.copy(f, job.root / "ss" / folder.name / f.name)
    roots = {r: w for r, w in job.expected["bridge"].items() if w["bridge"] == "golden"}
    assert roots, "no format-2 root in formats-0.1"
    for root, want in roots.items():
        files = _tree_files(job, want["bridge"])
        try:
            files.ensure(root)
            rv = files.view.roots[root]
            live = {
                p: files.read(root, p, 0, 1 << 20).hex()
                for p, e in rv.files.items()
                if not e.deleted
            }
            assert live == want["files"]
            assert {p: _entry(job, e) for p, e in sorted(rv.files.items())} == want["entries"]
        finally:
            files.client.close()


def _wire_frames() -> list[list[bytes]]:
    frames: list[list[bytes]] = msgpack.unpackb((FOLDER / "wire.msgpack").read_bytes())
    return frames


def test_every_wire_message_loads() -> None:
    expected = json.loads((FOLDER / "expected.json").read_text())["wire"]
    frames = _wire_frames()
    _assert_agrees([plain(wire.load(f)) for f in frames], expected)


# -- every format of today is frozen in some golden folder ----------------------------------


def _folders() -> list[Path]:
    return sorted(p for p in GOLDEN.glob("formats-*") if p.is_dir())


def _versions(folder: Path) -> dict[str, set[Any]]:
    """The format versions the files of ``folder`` are written in, read from the files."""
    out: dict[str, set[Any]] = {k: set() for k in ("object", "segment", "record", "metadata")}
    out.update({k: set() for k in ("snapshot", "split log", "manifest", "wire")})
    for f in (folder / "changelog").rglob("*.dstl"):
        raw = f.read_bytes()
        out["object"].add(FOOTER.unpack(raw[-FOOTER_SIZE:])[1])
        body = raw[: FOOTER.unpack(raw[-FOOTER_SIZE:])[3]]
        idx = msgpack.unpackb(raw[len(body) : -FOOTER_SIZE])
        for row in idx["segments"]:
            out["segment"].add(_segment_header(body[row[4] : row[4] + row[5]])["v"])
    for f in (folder / "checkpoints").glob("commit-*.json"):
        record = json.loads(f.read_text())
        out["record"].add(record["version"])
        out["metadata"] |= {c["version"] for c in record["checkpoints"]}
    for f in (folder / "materialized").rglob("*.snap"):
        out["snapshot"].add(msgpack.unpackb(f.read_bytes(), strict_map_key=False)["v"])
    for f in (folder / "materialized").rglob("*.splits"):
        out["split log"].add(json.loads(f.read_text())["version"])
    for f in (folder / "ss").rglob("manifest-*.json"):
        out["manifest"].add(json.loads(f.read_text())["format"])
    expected = json.loads((folder / "expected.json").read_text())
    out["wire"] = {m["dataclass"] for m in expected["wire"]}
    return out


def test_every_version_written_today_has_a_golden_file() -> None:
    """A version that writes a new format (or wire message) must freeze it in a new
    golden folder: the formats of this code are all in some folder."""
    held: dict[str, set[Any]] = {}
    for folder in _folders():
        for kind, versions in _versions(folder).items():
            held.setdefault(kind, set()).update(versions)
    today = {
        "object": set(FORMAT_VERSIONS),
        "segment": set(SEGMENT_VERSIONS),
        "record": {RECORD_VERSION},
        "metadata": {METADATA_VERSION, METADATA_VERSION_ALIGNED},
        "snapshot": {state_backend.SNAPSHOT_VERSION, state_backend.PART_VERSION},
        "split log": {splitlog.VERSION},
        "manifest": {MANIFEST_FORMAT},
        "wire": {t.__name__ for t in typing.get_args(wire.Message)},
    }
    missing = {k: sorted(v - held.get(k, set()), key=str) for k, v in today.items()}
    assert not any(missing.values()), f"formats without a golden file: {missing}"


# -- a future version of every format is refused ----------------------------------------------


@contextmanager
def _refused(err: type[Exception], *names: str) -> Iterator[pytest.ExceptionInfo[Exception]]:
    """The body must raise ``err`` naming every one of ``names`` and FUTURE."""
    with pytest.raises(err) as info:
        yield info
    text = str(info.value)
    for name in names:
        assert name in text, f"{name!r} not in {text!r}"
    assert str(FUTURE) in text, text


def _as_future(raw: bytes) -> bytes:
    """The object as a newer format might write it: FUTURE in its footer and in its
    index (whose checksum a newer format computes anew)."""
    magic, _, reserved, offset, length, _ = FOOTER.unpack(raw[-FOOTER_SIZE:])
    index = msgpack.unpackb(raw[offset : offset + length])
    index["v"] = FUTURE
    packed = msgpack.packb(index)
    footer = FOOTER.pack(magic, FUTURE, reserved, offset, len(packed), zlib.crc32(packed))
    return raw[:offset] + packed + footer


def test_an_object_of_a_future_format_is_refused(job: Job) -> None:
    for rel in job.expected["objects"]:
        f = job.root / rel
        f.write_bytes(_as_future(f.read_bytes()))
        for verify in (True, False):
            with _refused(UnsupportedVersionError, rel, "object format") as info:
                read_index(job.store, job.url(rel), verify)
            assert isinstance(info.value, UnsupportedVersionError)
            assert info.value.version == FUTURE


def test_a_damaged_version_field_is_corruption_not_a_newer_format(job: Job) -> None:
    """Only the footer's version changed (a flipped byte): the index still carries its
    own version's checksum, so the object is reported corrupt at the version field, not
    as written by a newer dstltree (which would send an operator to upgrade)."""
    for rel in job.expected["objects"]:
        f = job.root / rel
        raw = bytearray(f.read_bytes())
        struct.pack_into("!H", raw, len(raw) - FOOTER_SIZE + 8, FUTURE)
        f.write_bytes(raw)
        for verify in (True, False):
            with pytest.raises(CorruptObjectError) as info:
                read_index(job.store, job.url(rel), verify)
            assert not isinstance(info.value, UnsupportedVersionError)
            assert info.value.offset == len(raw) - FOOTER_SIZE + 8
            assert rel in str(info.value) and "the footer is corrupt" in str(info.value)


def _bump_segment(raw: bytearray, offset: int) -> None:
    """Set the ``v`` of the segment header at ``offset`` of ``raw`` to FUTURE, in place
    (a msgpack positive fixint either way: same length)."""
    (hlen,) = struct.unpack_from("!I", raw, offset)
    header = msgpack.unpackb(bytes(raw[offset + 4 : offset + 4 + hlen]))
    header["v"] = FUTURE
    packed = msgpack.packb(header)
    assert len(packed) == hlen
    raw[offset + 4 : offset + 4 + hlen] = packed


def test_a_segment_of_a_future_version_is_refused(job: Job) -> None:
    """Every segment (of every version, compressed or not), its header's version
    bumped: refused by version, not reported as a checksum mismatch."""
    for rel in job.expected["objects"]:
        f = job.root / rel
        pristine = f.read_bytes()
        for ref in read_index(job.store, job.url(rel)):
            raw = bytearray(pristine)
            _bump_segment(raw, ref.offset)
            f.write_bytes(raw)
            with _refused(UnsupportedVersionError, rel, "segment format") as info:
                read_segment(job.store, ref, ref.log_id)
            assert isinstance(info.value, UnsupportedVersionError)
            assert (info.value.kind, info.value.version) == ("segment", FUTURE)
            with _refused(UnsupportedVersionError, rel, "segment format"):
                read_index(job.store, job.url(rel), verify=True)
        f.write_bytes(pristine)


def _records(job: Job) -> list[Path]:
    return sorted(p for p in (job.root / "checkpoints").glob("commit-*.json"))


def _edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """Apply ``edit`` to the JSON document at ``path``; returns the bytes it had."""
    before = path.read_bytes()
    doc = json.loads(before)
    edit(doc)
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return before


def test_a_commit_record_of_a_future_version_is_refused(job: Job) -> None:
    records = [p for p in _records(job) if json.loads(p.read_text())["kind"] == "checkpoint"]
    assert records
    for path in records:
        before = _edit_json(path, lambda d: d.update(version=FUTURE))
        with _refused(CorruptCheckpointError, path.name, "commit record format version"):
            CheckpointStore(job.store).list_retained()
        path.write_bytes(before)


def test_checkpoint_metadata_of_a_future_version_is_refused(job: Job) -> None:
    for path in _records(job):
        doc = json.loads(path.read_text())
        if not doc["checkpoints"]:
            continue
        cid = doc["checkpoints"][0]["checkpoint_id"]
        before = _edit_json(path, lambda d: d["checkpoints"][0].update(version=FUTURE))
        with _refused(CorruptCheckpointError, path.name, "checkpoint metadata format version"):
            CheckpointStore(job.store).load(cid)
        path.write_bytes(before)
    # the metadata's own reader, given no path (the store names the file)
    d = json.loads(_records(job)[-1].read_text())["checkpoints"][0]
    with _refused(ValueError, "checkpoint metadata format version"):
        CompletedCheckpoint.from_dict({**d, "version": FUTURE})


def test_a_split_log_of_a_future_version_is_refused(job: Job) -> None:
    (path,) = (job.root / "materialized").rglob("*.splits")
    _edit_json(path, lambda d: d.update(version=FUTURE))
    with _refused(CorruptCheckpointError, str(path.relative_to(job.root)), "split log format"):
        CheckpointStore(job.store).load_latest()


def _snapshot_files(job: Job) -> Iterator[tuple[str, bool | None]]:
    """(relative path, delta; None for a full snapshot) of every snapshot file the
    latest checkpoint names."""
    latest = job.expected["checkpoints"][str(job.expected["latest"])]
    for task in latest["tasks"].values():
        if task["snapshot"] is not None:
            yield from ((rel, delta) for rel, delta in task["snapshot"]["files"])


def test_a_state_snapshot_of_a_future_version_is_refused(job: Job) -> None:
    """The full snapshot and the whole and delta parts, each bumped in turn."""
    files = list(_snapshot_files(job))
    assert {d for _, d in files} == {None, False, True}
    latest = CheckpointStore(job.store).load_latest()
    assert latest is not None
    for rel, _ in files:
        f = job.root / rel
        before = f.read_bytes()
        doc = msgpack.unpackb(before, strict_map_key=False)
        doc["v"] = FUTURE
        f.write_bytes(msgpack.packb(doc))
        with _refused(ValueError, rel, "state snapshot format version"):
            restore_key_groups(job.store, latest, _backend(job.expected["max_parallelism"]))
        f.write_bytes(before)


def _golden_segment(job: Job, want: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    for obj in job.expected["objects"].values():
        for seg in obj["segments"]:
            if want(seg):
                return {**seg, "format": obj["format"]}
    raise AssertionError("no such golden segment")


def _object_of(job: Job, seg: dict[str, Any], kg: int, change: bytes) -> ChangelogHandle:
    """A copy of golden segment ``seg`` holding only ``change`` (of key group ``kg``),
    encoded as it was (version, codec) in an object of its object's format; its handle."""
    log, (lo, _) = seg["log"], seg["sqn"]
    data = encode_segment(
        log, lo, lo + 1, {lo: {kg: [change]}}, version=seg["version"], compression=seg["codec"]
    )
    meta = SegmentMeta(log, lo, lo + 1, (kg,), len(data), segment_crc(data))
    parts, offsets = build_object([(meta, data)], seg["format"])
    path = job.store.new_object_path()
    job.store.put(path, parts)
    return ChangelogHandle(log, (lo, lo + 1), (SegmentRef(meta, path, offsets[0]),))


def _one_task(job: Job, handle: ChangelogHandle, channel: bool = False) -> CompletedCheckpoint:
    max_p = job.expected["max_parallelism"]
    tc = TaskCheckpoint(
        0,
        0,
        changelog=() if channel else (handle,),
        key_groups=(0, max_p),
        channel_state=(handle,) if channel else (),
        unaligned=channel,
    )
    return CompletedCheckpoint(1, 0, 0, 0.0, 0.0, {0: tc}, 1, max_p)


def _is_state_log(log: str) -> bool:
    return log.startswith("golden-t") and not _is_channel_log(log)


@pytest.mark.parametrize("op", sorted(ALL_OPS))
@pytest.mark.parametrize("squash", [True, False])
def test_a_state_change_of_a_future_kind_is_refused(job: Job, op: int, squash: bool) -> None:
    """Each change kind, its operation bumped to 99: the restore names the object."""
    seg = _golden_segment(job, lambda s: _is_state_log(s["log"]))
    _, kg, change = next(c for c in seg["changes"] if msgpack.unpackb(bytes.fromhex(c[2]))[0] == op)
    bumped = bytearray.fromhex(change)
    assert bumped[1] == op  # [op, ...]: a fixarray, then the op as a positive fixint
    bumped[1] = FUTURE
    handle = _object_of(job, seg, kg, bytes(bumped))
    backend = _backend(job.expected["max_parallelism"])
    with _refused(ValueError, handle.segments[0].path, "state change operation"):
        restore_key_groups(job.store, _one_task(job, handle), backend, squash=squash)


@pytest.mark.parametrize("kind", [INPUT, OUTPUT])
@pytest.mark.parametrize("where", ["kind", "frame"])
def test_channel_state_of_a_future_kind_is_refused(job: Job, kind: bytes, where: str) -> None:
    """A channel-state change whose kind byte, or whose batch frame's kind, is 99."""
    seg = _golden_segment(job, lambda s: _is_channel_log(s["log"]))
    _, kg, change = next(c for c in seg["changes"] if bytes.fromhex(c[2])[:1] == kind)
    bumped = bytearray.fromhex(change)
    at = 0 if where == "kind" else 2  # the frame: [kind, body], a fixarray then a fixint
    assert where == "kind" or bumped[1:3] == b"\x92\x00"
    bumped[at] = FUTURE
    handle = _object_of(job, seg, kg, bytes(bumped))
    max_p = job.expected["max_parallelism"]
    with _refused(ExchangeError, handle.segments[0].path):
        restore_inflight(job.store, _one_task(job, handle, channel=True), range(max_p))


def test_a_bridge_manifest_of_a_future_format_is_refused(job: Job) -> None:
    """Both formats' newest manifest, its format bumped: the rebuild of the root fails
    naming the manifest: the bridge answers ``unavailable`` with the view's reason."""
    for root, want in job.expected["bridge"].items():
        newest = want["manifests"][-1]
        _edit_json(job.root / newest, lambda d: d.update(format=FUTURE))
        files = _tree_files(job, want["bridge"])
        try:
            with _refused(BridgeWireError, newest, "manifest format") as info:
                files.ensure(root)
            assert info.value.code == "unavailable"
        finally:
            files.client.close()


def _reply(core: NodeCore, error: WireError) -> None:
    """The node answers the message that raised ``error`` with that error."""
    out = core.handle(MalformedFromBelow(0.0, b"peer", str(error)))
    assert ReplyBelow(b"peer", wire.Error(str(error))) in out


def _core() -> NodeCore:
    return NodeCore(NodeConfig("n", None, 1000, address="tcp://n:1", persist_delay=0.0))


def test_a_wire_message_of_a_future_type_or_shape_gets_an_error_reply() -> None:
    """Every golden message with its type renamed to one of a future version, or with
    its fields in a shape this version does not know: a WireError (naming the type),
    which a node answers with an error reply (it never crashes)."""
    core = _core()
    for frames in _wire_frames():
        header = msgpack.unpackb(frames[0])
        future = f"{header['t']}-v{FUTURE}"
        with _refused(WireError, future) as info:
            wire.load([msgpack.packb({**header, "t": future}), *frames[1:]])
        assert isinstance(info.value, WireError)
        _reply(core, info.value)
        reshaped = {**header, **{k: {"v": FUTURE} for k in header if k != "t"}}
        with pytest.raises(WireError) as shape:
            wire.load([msgpack.packb(reshaped), *frames[1:]])
        _reply(core, shape.value)


def test_a_hello_of_a_future_wire_version_is_refused_naming_it() -> None:
    """The golden hello of a writer, its versions bumped to [99]: the node refuses it
    with an error naming both sides' versions, and keeps refusing that peer."""
    core = _core()
    frames = _wire_frames()
    header = next(h for h in map(msgpack.unpackb, (f[0] for f in frames)) if h == HELLO)
    bumped = wire.load([msgpack.packb({**header, "v": [FUTURE]})])
    assert bumped == wire.WireHello((FUTURE,))
    (reply,) = core.handle(MessageFromBelow(0.0, b"peer", bumped))
    assert isinstance(reply, ReplyBelow) and isinstance(reply.message, wire.Error)
    assert wire.is_refusal(reply.message) and str(FUTURE) in reply.message.message
    register = next(f for f in frames if msgpack.unpackb(f[0])["t"] == "register")
    assert core.handle(MessageFromBelow(0.1, b"peer", wire.load(register))) == [reply]


def test_every_wire_message_of_0_2_loads() -> None:
    """The wire shapes added in 0.2 (notes, flush groups) read back as written."""
    folder = GOLDEN / "formats-0.2"
    expected = json.loads((folder / "expected.json").read_text())["wire"]
    frames: list[list[bytes]] = msgpack.unpackb((folder / "wire.msgpack").read_bytes())
    _assert_agrees([plain(wire.load(f)) for f in frames], expected)
