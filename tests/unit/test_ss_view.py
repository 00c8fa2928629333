"""The bridge's pure view: writes, durability, deletions, releases, rebuilds."""

from __future__ import annotations

import pytest

from dstltree.client.handle import SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.structured_streaming.view import (
    DeleteObject,
    ReadIndex,
    View,
    log_id,
    parse_log_id,
    query_key,
)

R = "file:/tmp/q"
K = query_key(R)
P = "state/0/1/1.changelog"


def ref(path: str, sqn: int, url: str, kg: int = 0, offset: int = 0) -> SegmentRef:
    return SegmentRef(SegmentMeta(log_id(K, path), sqn, sqn + 1, (kg,), 40, 1), url, offset)


def loaded(manifest=None, segments=()) -> View:  # type: ignore[no-untyped-def]
    v = View()
    v.on_loaded(R, manifest, segments)
    v.validate()
    return v


def test_query_key_and_log_ids() -> None:
    assert len(K) == 16 and int(K, 16) >= 0
    assert parse_log_id(log_id(K, P)) == (K, P)
    assert parse_log_id("task3") is None and parse_log_id("ss/short/x") is None


def test_sqns_rise_even_when_the_clock_does_not() -> None:
    v = View()
    assert [v.new_sqn(5), v.new_sqn(5), v.new_sqn(3), v.new_sqn(100)] == [5, 6, 7, 100]


def test_write_pending_then_durable() -> None:
    v = loaded()
    v.on_accepted(R, P, b"abc", 10)
    v.new_sqn(10)
    assert v.get(R, P).data == b"abc" and v.pending(R) == {(P, 10)}
    assert v.on_durable(R, P, 10, ref(P, 10, "o1")) == []
    v.validate()
    e = v.get(R, P)
    assert e.data is None and e.ref.path == "o1" and e.length == 3 and v.pending(R) == set()
    assert v.listing(R, "state/0/1") == ([("1.changelog", 3)], [])
    assert v.listing(R, "state") == ([], ["0"])


def test_failed_write_loses_the_file_and_fails_the_next_commit_once() -> None:
    v = loaded()
    v.new_sqn(1)
    v.on_accepted(R, P, b"x", 1)
    v.on_failed(R, P, 1)
    v.validate()
    assert v.get(R, P) is None and v.pending(R) == set()
    assert v.take_failures(R) == {P} and v.take_failures(R) == set()


def _durable(v: View, path: str, sqn: int, url: str, data: bytes = b"d") -> list:
    v.new_sqn(sqn)
    v.on_accepted(R, path, data, sqn)
    return v.on_durable(R, path, sqn, ref(path, sqn, url))


def _manifest(v: View) -> list:
    m = v.manifest(R)
    assert m is not None
    return v.on_manifest_written(R, m["seq"])


def test_replaced_file_releases_its_object_after_a_manifest() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    assert _durable(v, P, 2, "o2") == []  # o1 dead, but no manifest after the death yet
    v.validate()
    assert _manifest(v) == [ReadIndex("o1")]
    # the index names a segment of another writer: the object stays
    foreign = SegmentRef(SegmentMeta("task1", 0, 1, (0,), 9, 1), "o1", 40)
    assert v.on_index("o1", [ref(P, 1, "o1"), foreign]) == []
    assert v.on_index("o1", [ref(P, 1, "o1")]) == [DeleteObject("o1")]
    assert v.on_object_deleted("o1") == []
    v.validate()
    assert "o1" not in v.objects and v.get(R, P).ref.path == "o2"


def test_object_with_a_live_file_is_kept() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    _durable(v, "state/0/2/1.changelog", 2, "o1")
    _durable(v, P, 3, "o2")
    assert _manifest(v) == []  # o1 still holds a live file
    v.validate()


def test_delete_leaves_a_tombstone_until_older_objects_are_gone() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    v.new_sqn(2)
    assert v.on_delete(R, P, 2) and not v.on_delete(R, P, 3)
    assert v.get(R, P) is None and v.pending(R) == {(P, 2)}
    assert v.on_durable(R, P, 2, ref(P, 2, "o2", kg=1)) == []
    v.validate()
    assert v.roots[R].files[P].older == {"o1"}
    assert _manifest(v) == [ReadIndex("o1")]
    assert v.on_index("o1", [ref(P, 1, "o1")]) == [DeleteObject("o1")]
    assert v.on_object_deleted("o1") == []  # the tombstone dies; o2 awaits a manifest
    v.validate()
    assert P not in v.roots[R].files
    assert _manifest(v) == [ReadIndex("o2")]
    assert v.on_index("o2", [ref(P, 2, "o2", kg=1)]) == [DeleteObject("o2")]


def test_write_and_delete_in_one_object_release_it() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    v.new_sqn(2)
    v.on_delete(R, P, 2)
    assert v.on_durable(R, P, 2, ref(P, 2, "o1", kg=1, offset=40)) == []
    v.validate()
    assert P not in v.roots[R].files  # no older object: the tombstone went at once
    assert _manifest(v) == [ReadIndex("o1")]


def test_a_write_replaced_before_it_was_durable_dies_on_arrival() -> None:
    v = loaded()
    v.new_sqn(2)
    v.on_accepted(R, P, b"a", 1)
    v.on_accepted(R, P, b"bb", 2)
    v.on_durable(R, P, 1, ref(P, 1, "o1"))
    v.on_durable(R, P, 2, ref(P, 2, "o2"))
    v.validate()
    assert v.get(R, P).length == 2 and _manifest(v) == [ReadIndex("o1")]


def test_rebuild_from_indexes_newest_sqn_wins_and_tombstones_hide() -> None:
    q = "state/0/2/1.changelog"
    rows = [
        ref(P, 1, "o1"),
        ref(q, 2, "o1", offset=40),
        ref(P, 5, "o2"),  # P rewritten: newest wins
        ref(q, 6, "o2", kg=1, offset=40),  # q deleted
        SegmentRef(SegmentMeta("task9", 0, 1, (0,), 5, 1), "o2", 80),
        SegmentRef(SegmentMeta(log_id(query_key("file:/other"), P), 9, 10, (0,), 5, 1), "o3", 0),
    ]
    v = loaded(None, rows)
    assert v.get(R, P).sqn == 5 and v.get(R, P).length == -1 and v.get(R, q) is None
    assert v.roots[R].files[q].older == {"o1"}
    assert v.new_sqn(0) == 6 + 1 and "o3" not in v.objects
    v.set_length(R, P, 5, 12)
    assert v.listing(R, "state/0") == ([], ["1"])


def test_manifest_round_trip_and_newer_indexes() -> None:
    v = loaded()
    _durable(v, P, 1, "o1", b"hello")
    m = v.manifest(R)
    assert m is not None and m["format"] == 3 and m["root"] == R and m["seq"] == 0
    assert v.manifest(R) is None  # nothing changed since
    w = loaded(m, [ref(P, 7, "o9")])
    assert w.get(R, P).sqn == 7 and w.roots[R].manifest_seq == 1
    u = loaded(m, [ref(P, 1, "o1")])  # an object read again within the margin
    assert u.get(R, P).length == 5


def test_manifest_of_another_root_is_refused() -> None:
    v = View()
    with pytest.raises(ValueError):
        v.on_loaded(R, {"format": 1, "root": "file:/x", "seq": 0, "files": {}}, [])
    with pytest.raises(ValueError):
        v.on_loaded(R, {"format": 99, "root": R, "seq": 0, "files": {}}, [])


def test_unreadable_index_asks_again_later() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    _durable(v, P, 2, "o2")
    assert _manifest(v) == [ReadIndex("o1")]
    v.on_index_failed("o1")
    _durable(v, P, 3, "o3")
    assert ReadIndex("o1") in _manifest(v)


def _bridge(me: str, *manifests: dict) -> View:  # type: ignore[type-arg]
    v = View(me)
    v.on_loaded(R, list(manifests), [])
    v.validate()
    return v


def test_a_manifest_holds_its_own_bridges_files_only() -> None:
    a = _bridge("a")
    _durable(a, P, 10, "o1", b"from a")
    ma = a.manifest(R)
    assert ma is not None and ma["bridge"] == "a" and ma["files"][P]["by"] == "a"
    b = _bridge("b", ma)
    assert b.get(R, P).by == "a" and b.get(R, P).ref.path == "o1"
    _durable(b, "state/0/2/1.changelog", 11, "o2")
    mb = b.manifest(R)
    assert mb is not None and set(mb["files"]) == {"state/0/2/1.changelog"}
    assert "o1" not in b.objects  # a's object is a's to release
    b.validate()


def test_another_bridges_deletion_releases_the_writers_object_once_merged() -> None:
    a = _bridge("a")
    _durable(a, P, 10, "o1")
    ma = a.manifest(R)
    a.on_manifest_written(R, ma["seq"])
    b = _bridge("b", ma)
    b.new_sqn(20)
    assert b.on_delete(R, P, 20)
    b.on_durable(R, P, 20, ref(P, 20, "t1", kg=1))
    mb = b.manifest(R)
    assert mb["files"][P]["deleted"] and mb["files"][P]["older"] == ["o1"]
    assert b.objects.keys() == {"t1"}  # its tombstone's object only
    b.validate()
    assert a.on_merge(R, [mb]) == []  # o1 dies here; released after a's next manifest
    assert a.get(R, P) is None and a.root(R).files[P].by == "b"
    assert a.on_merge(R, [mb]) == []  # taken once
    m2 = a.manifest(R)
    assert m2 is not None and P not in m2["files"]
    assert a.on_manifest_written(R, m2["seq"]) == [ReadIndex("o1")]
    assert a.on_index("o1", [ref(P, 10, "o1")]) == [DeleteObject("o1")]
    a.validate()
    c = _bridge("c", ma, mb)  # a restart elsewhere merges both: the tombstone wins
    assert c.get(R, P) is None and c.root(R).files[P].deleted


def test_a_format_1_manifest_is_adopted() -> None:
    old = {
        "format": 1,
        "root": R,
        "seq": 4,
        "files": {
            P: {"sqn": 3, "length": 2, "deleted": False, "segment": ref(P, 3, "o9").to_dict()}
        },
    }
    v = _bridge("host-1", old)
    assert v.get(R, P).by == "host-1" and v.objects["o9"].live
    assert v.root(R).manifest_seq == 5
    with pytest.raises(ValueError, match="format 4"):
        _bridge("x", {**old, "format": 4})


def test_merge_drops_what_the_writer_no_longer_has_and_skips_format_1() -> None:
    a = _bridge("a")
    _durable(a, P, 10, "o1")
    m1 = a.manifest(R)
    a.on_manifest_written(R, m1["seq"])
    b = _bridge("b", m1)
    assert b.get(R, P).by == "a"
    a.new_sqn(20)
    a.on_delete(R, P, 20)  # deleted, the tombstone durable, o1 released: P is gone
    a.on_durable(R, P, 20, ref(P, 20, "t1", kg=1))
    a.on_manifest_written(R, a.manifest(R)["seq"])
    a.on_index("o1", [ref(P, 10, "o1")])
    a.on_object_deleted("o1")
    m3 = a.manifest(R)
    assert P not in m3["files"]
    b.on_merge(R, [m3])  # b never saw the tombstone's manifest
    assert b.get(R, P) is None and P not in b.root(R).files  # not served from o1
    b.validate()
    legacy = {**m1, "format": 1, "seq": 99}
    legacy.pop("bridge")
    v = _bridge("host-x", legacy)
    v.new_sqn(20)
    assert v.on_delete(R, P, 20)
    v.on_merge(R, [legacy])  # adopted at load: not taken again (P stays deleted)
    assert v.get(R, P) is None and v.root(R).files[P].deleted
    v.validate()


def test_a_rewrite_keeps_the_older_version_until_it_is_durable() -> None:
    b = _bridge("b")
    _durable(b, P, 10, "X", b"v1")
    b.on_manifest_written(R, b.manifest(R)["seq"])
    b.new_sqn(20)
    b.on_accepted(R, P, b"v2", 20)  # held: only in memory
    assert b.get(R, P).data == b"v2"  # readers see the new version
    assert b.manifest(R) is None  # nothing durable changed: no manifest is due
    b.root(R).dirty = True  # one written anyway (another file changed) still names v1
    m2 = b.manifest(R)
    assert m2["files"][P]["sqn"] == 10 and m2["files"][P]["segment"]["path"] == "X"
    assert b.on_manifest_written(R, m2["seq"]) == []  # X is not released
    b.validate()
    crashed = _bridge("b", m2)  # a restart before v2 was persisted: v1 is there
    assert crashed.get(R, P).sqn == 10
    b.new_sqn(30)
    b.on_accepted(R, P, b"v3", 30)  # rewritten again before v2 was durable
    assert b.on_durable(R, P, 20, ref(P, 20, "Y")) == []  # v2 replaced: dies
    assert b.get(R, P).prev.sqn == 10
    b.on_failed(R, P, 30)  # v3 failed: v1 is current again, the commit fails
    assert b.get(R, P).sqn == 10 and b.take_failures(R) == {P}
    b.validate()
    b.new_sqn(40)
    b.on_accepted(R, P, b"v4", 40)
    b.on_durable(R, P, 40, ref(P, 40, "Z"))  # durable: v1 dies now
    assert b.on_manifest_written(R, b.manifest(R)["seq"]) == [ReadIndex("X"), ReadIndex("Y")]
    b.validate()


# -- orphans: objects no version of this view needs --------------------------------------
P2 = "state/0/2/1.changelog"


def test_a_copy_of_a_durable_write_is_an_orphan_and_the_original_is_not() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    assert v.is_orphan("copy", [ref(P, 1, "copy")], (), aged=False)  # sent twice
    assert not v.is_orphan("o1", [ref(P, 1, "o1")], (), aged=False)
    assert not v.is_orphan("empty", [], (), aged=False)  # nothing of ours in it
    # a base path copied elsewhere: its manifests name the original's objects
    assert not v.is_orphan("copy", [ref(P, 1, "copy")], (), aged=True, present={"copy"})
    assert v.is_orphan("copy", [ref(P, 1, "copy")], (), aged=False, present={"copy", "o1"})


def test_a_copy_of_a_write_on_its_way_is_kept() -> None:
    v = loaded()
    v.new_sqn(1)
    v.on_accepted(R, P, b"d", 1)  # the node wrote it, the ack is on its way
    assert not v.is_orphan("o1", [ref(P, 1, "o1")], (), aged=False)
    _durable(v, P, 2, "o2")  # a rewrite keeps the durable version until it is durable
    v.on_accepted(R, P, b"e", 3)
    assert not v.is_orphan("o2", [ref(P, 2, "o2")], (), aged=False)
    assert v.is_orphan("copy", [ref(P, 2, "copy")], (), aged=False)


def test_a_write_reported_failed_that_landed_is_an_orphan() -> None:
    v = loaded()
    v.new_sqn(1)
    v.on_accepted(R, P, b"x", 1)
    v.on_failed(R, P, 1)  # the writer was told: the commit fails
    assert v.is_orphan("late", [ref(P, 1, "late")], (), aged=False)
    v.validate()


def test_an_object_with_another_writers_or_querys_rows_is_kept() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    foreign = SegmentRef(SegmentMeta("task1", 0, 1, (0,), 9, 1), "copy", 40)
    assert not v.is_orphan("copy", [ref(P, 1, "copy"), foreign], (), aged=True)
    other = SegmentRef(SegmentMeta(log_id(query_key("file:/q2"), P), 1, 2, (0,), 9, 1), "x", 0)
    assert not v.is_orphan("x", [other], (), aged=True)


def test_a_root_other_bridges_write_keeps_unknown_rows_until_aged() -> None:
    v = loaded()
    _durable(v, P, 5, "o1")
    unknown = [ref(P2, 3, "theirs")]  # another bridge's file, not in its manifest yet
    assert not v.is_orphan("theirs", unknown, {R}, aged=False)
    assert v.is_orphan("theirs", unknown, {R}, aged=True)
    assert not v.is_orphan("copy", [ref(P, 5, "copy")], {R}, aged=False)  # found by another?
    assert v.is_orphan("copy", [ref(P, 5, "copy")], {R}, aged=True)
    assert v.is_orphan("theirs", unknown, (), aged=False)  # no other bridge: it was ours


def test_a_tracked_object_waits_for_a_manifest_and_its_tombstones_go_with_it() -> None:
    v = loaded()
    _durable(v, P, 1, "o1")
    v.new_sqn(2)
    v.on_delete(R, P, 2)
    v.on_durable(R, P, 2, ref(P, 2, "o2", kg=1))
    assert v.roots[R].files[P].older == {"o1"}
    assert not v.is_orphan("o1", [ref(P, 1, "o1")], (), aged=True)  # death not in a manifest
    assert _manifest(v) == [ReadIndex("o1")]
    v.on_index_failed("o1")  # the release failed: the sweep takes it
    assert v.is_orphan("o1", [ref(P, 1, "o1")], (), aged=False)
    assert v.on_object_deleted("o1") == []
    v.validate()
    assert P not in v.roots[R].files  # the tombstone went with the older object


def test_manifests_name_objects_relative_to_the_base_and_refuse_climbing_out() -> None:
    from dstltree.structured_streaming.view import manifest_from_store, manifest_to_store

    base = "s3://bucket/jobs/a"
    seg = {"path": f"{base}/changelog/ab/x.dstl", "offset": 0, "length": 1}
    doc = {
        "format": 3,
        "files": {"offsets/0": {"segment": seg, "older": [f"{base}/changelog/cd/y.dstl"]}},
    }
    written = manifest_to_store(doc, base)
    entry = written["files"]["offsets/0"]
    assert entry["segment"]["path"] == "changelog/ab/x.dstl"
    assert entry["older"] == ["changelog/cd/y.dstl"]
    moved = manifest_from_store(written, "s3://other/copy", "m.json")
    assert moved["files"]["offsets/0"]["segment"]["path"] == "s3://other/copy/changelog/ab/x.dstl"
    assert manifest_from_store(written, base, "m.json") == doc
    for bad in ("../x.dstl", "/etc/x", "s3://elsewhere/x.dstl", "changelog//x"):
        hostile = {**written, "files": {"a": {"segment": {**seg, "path": bad}, "older": []}}}
        with pytest.raises(ValueError, match="m.json"):
            manifest_from_store(hostile, base, "m.json")
    old = {**doc, "format": 2}  # format 2 named them absolute: read as they are
    assert manifest_from_store(old, "s3://other", "m.json") == old
