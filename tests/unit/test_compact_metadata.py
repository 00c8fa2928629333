"""The compact form of checkpoint metadata in commit records (coordinator/compact.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.coordinator import checkpoint as checkpoint_module
from dstltree.coordinator.checkpoint import (
    CompletedCheckpoint,
    MaterializedRef,
    SnapshotPart,
    TaskCheckpoint,
)
from dstltree.coordinator.compact import expand, pack, runs, unpack
from dstltree.sparkplug.sinks.layout import Committable, final_name, staged_name
from dstltree.sparkplug.sinks.multipart import UploadPart
from dstltree.sparkplug.sources.base import EnumeratorState, Split, SplitState

BASE = "s3://bucket/jobs/run-1/checkpoints/plane-stats"


def _checkpoint() -> CompletedCheckpoint:
    segs = tuple(
        SegmentRef(
            SegmentMeta("log-0", i, i + 1, tuple(range(32)) + (40, 41), 100, 7),
            f"{BASE}/changelog/ab/{i:032x}.dstl",
            0,
        )
        for i in range(10)
    )
    outside = SegmentRef(SegmentMeta("log-0", 10, 11, (3,), 5, 1), "s3://other/n1/x.dstl", 9)
    part = SnapshotPart(f"{BASE}/materialized/cd/{1:032x}.snap", (0, 32), 1000)
    mat = MaterializedRef(part.path, 0, 1000, (part,), 1000)
    handle = ChangelogHandle("log-0", (0, 11), (*segs, outside))
    c = Committable(7, 0, 0, staged_name(7, 0, 0, "parquet"), final_name(7, 0, 0, "parquet"), 3, 99)
    tc = TaskCheckpoint(0, 0, 5, mat, (handle,), (0, 42), committables=(c,))
    pending = (
        SplitState(Split("f-1.parquet", "s3://in/landing/f-1.parquet"), 4),
        SplitState(Split("odd", "s3://in/landing/elsewhere.parquet"), 0),
    )
    enum = EnumeratorState(pending, {}, frozenset({"f-0.parquet"}), False)
    return CompletedCheckpoint(7, 0, 1, 1.0, 0.2, {0: tc}, 1, 128, enum)


def test_pack_is_smaller_and_unpacks_to_the_same_checkpoint() -> None:
    cp = _checkpoint()
    d = cp.to_dict()
    packed = pack(d, BASE)
    seg = packed["tasks"][0]["changelog"][0]["segments"][0]
    assert seg == [1, 0, 100, 0, 1, 7, [[0, 32], [40, 42]]]  # path 1: after the snapshot
    assert packed["paths"][1] == f"./changelog/ab/{0:032x}.dstl"
    assert packed["paths"][seg[0]] == f"./changelog/ab/{0:032x}.dstl"
    last = packed["tasks"][0]["changelog"][0]["segments"][-1]
    assert packed["paths"][last[0]] == "s3://other/n1/x.dstl"
    mat = packed["tasks"][0]["materialized"]
    assert mat["path"] == mat["parts"][0][0] == 0  # one entry for both
    assert mat["parts"][0] == [0, 0, 32, 1000, False]
    lean = packed["tasks"][0]["committables"][0]
    assert lean[:3] == [7, 0, 0] and lean[4:] == ["parquet", 3, 99]
    enum = packed["enumerator"]
    assert enum["pending_prefix"] == "s3://in/landing/"
    assert enum["pending"][0][:2] == ["f-1.parquet", None]
    assert enum["pending"][1][:2] == ["odd", "s3://in/landing/elsewhere.parquet"]
    assert len(json.dumps(packed)) * 3 < len(json.dumps(d)) * 2
    assert CompletedCheckpoint.from_dict(unpack(json.loads(json.dumps(packed)), BASE)) == cp
    assert d == cp.to_dict()  # pack copies


def test_malformed_compact_metadata_is_refused() -> None:
    packed = pack(_checkpoint().to_dict(), BASE)
    packed["tasks"][0]["changelog"][0]["segments"][0] = ["x", 0]
    with pytest.raises(ValueError, match="segment row"):
        unpack(packed, BASE)


def test_key_group_runs() -> None:
    assert runs([5, 1, 2, 3, 3, 9]) == [[1, 4], [5, 6], [9, 10]]
    assert expand([[1, 4], [5, 6]]) == [1, 2, 3, 5]
    assert expand([]) == []
    for hostile in ([[3, 2]], [[1, 4], [2, 6]], [[0, 1 << 30]], [[True, 2]], "x", [[1]]):
        with pytest.raises((ValueError, TypeError)):
            expand(hostile)


def test_a_multipart_committable_is_a_row_and_round_trips() -> None:
    staged = staged_name(7, 0, 0, "parquet")
    c = Committable(
        7,
        0,
        0,
        staged,
        final_name(7, 0, 0, "parquet"),
        3,
        99,
        "up-1",
        (UploadPart(1, '"etag"', 99),),
    )
    cp = _checkpoint()
    tc = replace(cp.tasks[0], committables=(c,))
    cp = replace(cp, tasks={0: tc})
    packed = pack(cp.to_dict(), BASE)
    lean = packed["tasks"][0]["committables"][0]
    assert isinstance(lean, list) and len(lean) == 9 and lean[7:] == ["up-1", [[1, '"etag"', 99]]]
    assert CompletedCheckpoint.from_dict(unpack(json.loads(json.dumps(packed)), BASE)) == cp
    # format version 3 wrote it as a dict without its final name: still read
    old = json.loads(json.dumps(packed))
    old["tasks"][0]["committables"] = [{k: v for k, v in c.to_wire().items() if k != "final"}]
    assert CompletedCheckpoint.from_dict(unpack(old, BASE)) == cp


def test_a_segment_of_its_task_s_whole_range_names_no_key_groups() -> None:
    cp = _checkpoint()
    tc = replace(cp.tasks[0], key_groups=(0, 32))
    seg = SegmentRef(SegmentMeta("log-0", 0, 1, tuple(range(32)), 10, 1), f"{BASE}/x.dstl", 0)
    tc = replace(tc, changelog=(ChangelogHandle("log-0", (0, 1), (seg,)),))
    cp = replace(cp, tasks={0: tc})
    packed = pack(cp.to_dict(), BASE)
    assert packed["tasks"][0]["changelog"][0]["segments"][0][-1] is None
    assert CompletedCheckpoint.from_dict(unpack(json.loads(json.dumps(packed)), BASE)) == cp


# -- unaligned checkpoints (FLIP-76): channel state and alignment figures ----------------


def _unaligned() -> CompletedCheckpoint:
    """``_checkpoint`` whose task took it unaligned: its in-flight records in an object
    of its own and in the object of its state changes, one of another task's key
    groups (output channel state)."""
    cp = _checkpoint()
    shared = cp.tasks[0].changelog[0].segments[0].path
    own = f"{BASE}/changelog/ef/{99:032x}.dstl"
    segs = (
        SegmentRef(SegmentMeta("log-0-cs", 0, 1, (0, 1, 2), 40, 3), own, 0),
        SegmentRef(SegmentMeta("log-0-cs", 1, 2, (50,), 60, 4), shared, 100),
    )
    tc = replace(
        cp.tasks[0],
        channel_state=(ChangelogHandle("log-0-cs", (0, 2), segs),),
        unaligned=True,
        alignment_s=0.125,
        start_delay_s=0.5,
        inflight_bytes=100,
    )
    return replace(cp, tasks={0: tc})


def test_channel_state_and_alignment_figures_round_trip_through_a_record() -> None:
    cp = _unaligned()
    d = cp.to_dict()
    assert d["version"] == 4  # a reader of version 3 would drop the in-flight records
    t = d["tasks"][0]
    assert (t["unaligned"], t["alignment_s"], t["start_delay_s"], t["inflight_bytes"]) == (
        True,
        0.125,
        0.5,
        100,
    )
    packed = pack(d, BASE)
    rows = packed["tasks"][0]["channel_state"][0]["segments"]
    # compact like changelog segments: paths in the table, shared with the state's
    assert packed["paths"][rows[0][0]] == f"./changelog/ef/{99:032x}.dstl"
    assert rows[1][0] == packed["tasks"][0]["changelog"][0]["segments"][0][0]
    assert rows[1][1:] == [100, 60, 1, 2, 4, [[50, 51]]]
    back = CompletedCheckpoint.from_dict(unpack(json.loads(json.dumps(packed)), BASE))
    assert back == cp and back.tasks[0].channel_state == cp.tasks[0].channel_state
    assert CompletedCheckpoint.from_dict(json.loads(json.dumps(d))) == cp
    assert d == cp.to_dict()  # pack copies


def test_an_aligned_checkpoint_is_written_as_before_and_old_metadata_loads() -> None:
    cp = _checkpoint()
    d = cp.to_dict()
    assert d["version"] == 3  # still read by the previous version
    fields = {"channel_state", "unaligned", "alignment_s", "start_delay_s", "inflight_bytes"}
    assert not fields & set(d["tasks"][0])
    assert "channel_state" not in pack(d, BASE)["tasks"][0]
    # metadata written before the fields existed decodes to their defaults
    tc = CompletedCheckpoint.from_dict(unpack(pack(d, BASE), BASE)).tasks[0]
    assert (tc.channel_state, tc.unaligned, tc.alignment_s) == ((), False, 0.0)
    assert (tc.start_delay_s, tc.inflight_bytes) == (0.0, 0)
    # figures without channel state (nothing in flight) round trip in version 3
    quiet = replace(cp.tasks[0], unaligned=True, start_delay_s=0.25)
    d = replace(cp, tasks={0: quiet}).to_dict()
    assert d["version"] == 3 and TaskCheckpoint.from_dict(d["tasks"][0]) == quiet


def test_malformed_channel_state_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    d = _unaligned().to_dict()
    for key, bad in (("channel_state", {"log_id": "x"}), ("unaligned", "false")):
        t = {**d["tasks"][0], key: bad}
        with pytest.raises(TypeError, match=key):
            TaskCheckpoint.from_dict(t)
    packed = pack(d, BASE)
    packed["tasks"][0]["channel_state"][0]["segments"][0] = [0, 1]
    with pytest.raises(ValueError, match="segment row"):
        unpack(packed, BASE)
    # a reader of versions 2 and 3 only refuses it rather than drop the in-flight
    # records, and still reads an aligned checkpoint
    monkeypatch.setattr(checkpoint_module, "METADATA_VERSIONS", (2, 3))
    with pytest.raises(ValueError, match="version 4 is not known"):
        CompletedCheckpoint.from_dict(d)
    aligned = _checkpoint()
    assert CompletedCheckpoint.from_dict(json.loads(json.dumps(aligned.to_dict()))) == aligned
