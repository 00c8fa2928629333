"""The compact form of checkpoint metadata in commit records (coordinator/compact.py)."""

from __future__ import annotations

import json

import pytest

from dstltree.client.handle import ChangelogHandle, SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.coordinator.checkpoint import (
    CompletedCheckpoint,
    MaterializedRef,
    SnapshotPart,
    TaskCheckpoint,
)
from dstltree.coordinator.compact import expand, pack, runs, unpack

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
    tc = TaskCheckpoint(0, 0, 5, mat, (handle,), (0, 42))
    return CompletedCheckpoint(7, 0, 1, 1.0, 0.2, {0: tc}, 1, 128)


def test_pack_is_smaller_and_unpacks_to_the_same_checkpoint() -> None:
    cp = _checkpoint()
    d = cp.to_dict()
    packed = pack(d, BASE)
    seg = packed["tasks"][0]["changelog"][0]["segments"][0]
    assert seg["path"] == f"./changelog/ab/{0:032x}.dstl" and seg["kg"] == [[0, 32], [40, 42]]
    assert packed["tasks"][0]["changelog"][0]["segments"][-1]["path"] == "s3://other/n1/x.dstl"
    assert len(json.dumps(packed)) * 3 < len(json.dumps(d)) * 2
    assert CompletedCheckpoint.from_dict(unpack(json.loads(json.dumps(packed)), BASE)) == cp
    assert d == cp.to_dict()  # pack copies


def test_key_group_runs() -> None:
    assert runs([5, 1, 2, 3, 3, 9]) == [[1, 4], [5, 6], [9, 10]]
    assert expand([[1, 4], [5, 6]]) == [1, 2, 3, 5]
    assert expand([]) == []
    for hostile in ([[3, 2]], [[1, 4], [2, 6]], [[0, 1 << 30]], [[True, 2]], "x", [[1]]):
        with pytest.raises((ValueError, TypeError)):
            expand(hostile)
