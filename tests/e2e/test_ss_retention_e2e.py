"""300 batches of a Structured Streaming query through the tree with
``spark.sql.streaming.minBatchesToRetain=10`` (RocksDB, changelog checkpointing, state
maintenance every second), on ``local[2]``: Spark deletes the versions it no longer
retains, the bridge writes tombstones and releases objects. Once the bridge stopped
(it writes its last manifest), ``dstl inspect`` finds no orphan and no missing object,
the result equals the batch answer, no state file is under the checkpoint and the
bridge's view holds at most two thirds of the 1,200 changelogs (retention reached the
tree). How many fewer is Spark's: beside another test suite its maintenance (asked for
every second) uploaded snapshots 150, 202, 222 and 274 only and deleted nothing after
version 150, leaving 604 (measured); alone it kept at most 40 versions, the
bound this test held before.

Spark's default checkpoint format (version 1): RocksDB's maintenance reads the old
snapshots' zip files through Hadoop's ``FileSystem`` (``Utils.unzipFilesFromFile``),
past the checkpoint file manager; ``DstlLocalFileSystem`` serves them from the tree
(before it, maintenance found none and deleted nothing: 300 batches kept all 1,200
changelogs and 120 zips, measured). No SST file is under the checkpoint either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstltree.cli.commands.inspect import inspect_base
from dstltree.structured_streaming.files import manifest_name
from tests.integration.test_ss_cluster import _expected, _finish, _start, _write_input
from tests.support.ss_session import STATE_SUFFIXES, ss_session, start_tree

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BATCHES = 300
QUERY_TIMEOUT = 900.0  # seconds for the 300 batches (about 200 s on a busy 2-core machine)


@pytest.mark.timeout(1200)
def test_300_batches_leave_no_orphan_and_no_missing_object(tmp_path: Path) -> None:
    source, checkpoint, base = tmp_path / "in", tmp_path / "ckpt", tmp_path / "dstl"
    for n in range(1, BATCHES + 1):
        _write_input(source, n)
    services = start_tree(tmp_path)  # its objects under tmp_path / "dstl"
    try:
        spark = ss_session(master="local[2]", socket=services.socket)
        try:
            spark.conf.set("spark.sql.streaming.minBatchesToRetain", "10")
            spark.conf.set("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
            q = _start(spark, source, checkpoint, "retained")
            got = _finish(spark, q, "retained", timeout=QUERY_TIMEOUT)
            assert got == _expected(spark, source)
        finally:
            spark.stop()
    finally:
        services.stop()  # the bridge writes its last manifest
    assert (checkpoint / "commits" / str(BATCHES - 1)).exists()
    assert [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)] == []
    info = inspect_base(str(base), {})
    assert len(info["ss_queries"]) == 1
    assert info["present"], "no object in the tree"
    assert info["orphans"] == [] and info["missing"] == []
    manifest = _newest(base)
    files = json.loads(manifest.read_text())["files"]
    changelogs = [p for p, e in files.items() if p.endswith(".changelog") and not e["deleted"]]
    assert len(changelogs) <= 4 * BATCHES * 2 // 3, "old versions were not deleted from the tree"


def _newest(base: Path) -> Path:
    """The newest manifest under ``base/ss`` (one query, one bridge)."""
    found = [(manifest_name(str(p)), p) for p in base.glob("ss/*/manifest-*.json")]
    return max((named[1], p) for named, p in found if named is not None)[1]
