"""300 batches of a Structured Streaming query through the tree with
``spark.sql.streaming.minBatchesToRetain=10`` (RocksDB, changelog checkpointing, state
maintenance every second), on ``local[2]``, then two rounds of 11 more: Spark deletes
the versions it no longer retains, the bridge writes tombstones and releases objects.
Once the bridge stopped (it writes its last manifest), ``dstl inspect`` finds no orphan
and no missing object, the result equals the batch answer, no state file is under the
checkpoint and the bridge's view holds the changelogs of the last two rounds only.

Spark's maintenance is a thread: it uploads the newest snapshot a commit made and
deletes old versions only once two uploaded snapshots lie ``minBatchesToRetain`` apart.
How often it runs during the 300 batches is the machine's: beside another test suite it
uploaded snapshots 150, 202, 222 and 274 only in one run, and in a CI run it deleted
nothing (all 1,200 changelogs kept). So the test does not count on it there. After the 300 the query
keeps running; each round of 11 batches (more than ``minDeltasForSnapshot``, 10) makes a
snapshot in every partition, and the test waits, bounded, until the tree holds it (the
first round) and until the old changelogs are gone from the tree (the second).

Spark's default checkpoint format (version 1): RocksDB's maintenance reads the old
snapshots' zip files through Hadoop's ``FileSystem`` (``Utils.unzipFilesFromFile``),
past the checkpoint file manager; ``DstlLocalFileSystem`` serves them from the tree
(before it, maintenance found none and deleted nothing: 300 batches kept all 1,200
changelogs and 120 zips, measured). No SST file is under the checkpoint either."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dstltree.cli.commands.inspect import inspect_base
from dstltree.structured_streaming.files import manifest_name
from tests.integration.test_ss_cluster import _expected, _start, _write_input
from tests.support.ss_session import STATE_SUFFIXES, listed, ss_session, start_tree
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BATCHES = 300
ROUND = 11  # batches per round after the 300: more than minDeltasForSnapshot (10)
PARTITIONS = 4  # spark.sql.shuffle.partitions of the session
QUERY_TIMEOUT = 900.0  # seconds for the 300 batches (about 200 s on a busy 2-core machine)
ROUND_TIMEOUT = 180.0  # seconds for a round's batches, then for its maintenance
POLL_S = 0.2  # seconds between looks at the query and the tree


@pytest.mark.timeout(1500)
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
            q = _start(spark, source, checkpoint, "retained", available_now=False)
            try:
                _await_batch(q, checkpoint, BATCHES - 1, QUERY_TIMEOUT)
                _round(q, spark, source, checkpoint, 1, _snapshot_from(BATCHES + 1))
                _round(q, spark, source, checkpoint, 2, _changelogs_at_most(2 * ROUND))
                got = {tuple(r) for r in spark.sql("SELECT k, n, s FROM retained").collect()}
                assert got == _expected(spark, source)
            finally:
                q.stop()
        finally:
            spark.stop()
    finally:
        services.stop()  # the bridge writes its last manifest
    assert (checkpoint / "commits" / str(BATCHES + 2 * ROUND - 1)).exists()
    assert [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)] == []
    info = inspect_base(str(base), {})
    assert len(info["ss_queries"]) == 1
    assert info["present"], "no object in the tree"
    assert info["orphans"] == [] and info["missing"] == []
    manifest = _newest(base)
    files = json.loads(manifest.read_text())["files"]
    changelogs = [p for p, e in files.items() if p.endswith(".changelog") and not e["deleted"]]
    assert len(changelogs) <= PARTITIONS * 2 * ROUND, "old versions were not deleted"


def _round(q: Any, spark: Any, source: Path, checkpoint: Path, r: int, done: Any) -> None:
    """Round ``r`` (1, 2): its ``ROUND`` input files, their batches committed, then
    ``done(names)`` true of every partition's state directory as the tree lists it."""
    first = BATCHES + (r - 1) * ROUND + 1  # the round's first input file
    for n in range(first, first + ROUND):
        _write_input(source, n)
    _await_batch(q, checkpoint, first + ROUND - 2, ROUND_TIMEOUT)  # batch N reads file N+1
    location = str(checkpoint)
    wait_until(
        lambda: all(done(listed(spark, location, f"state/0/{p}")) for p in range(PARTITIONS)),
        timeout=ROUND_TIMEOUT,
        interval=POLL_S,
    )


def _await_batch(q: Any, checkpoint: Path, batch: int, timeout: float) -> None:
    """Wait until ``q`` committed ``batch`` (its ``commits`` file exists); fails when
    the query stopped with an error."""

    def committed() -> bool:
        assert q.exception() is None, q.exception()
        return (checkpoint / "commits" / str(batch)).exists()

    wait_until(committed, timeout=timeout, interval=POLL_S)


def _version(name: str) -> int:
    """The state version of ``<V>.zip``, ``<V>.changelog`` (``<V>_<id>.*`` in format 2)."""
    return int(name.split(".")[0].split("_")[0])


def _snapshot_from(version: int) -> Any:
    return lambda names: any(n.endswith(".zip") and _version(n) >= version for n in names)


def _changelogs_at_most(count: int) -> Any:
    return lambda names: sum(n.endswith(".changelog") for n in names) <= count


def _newest(base: Path) -> Path:
    """The newest manifest under ``base/ss`` (one query, one bridge)."""
    found = [(manifest_name(str(p)), p) for p in base.glob("ss/*/manifest-*.json")]
    return max((named[1], p) for named, p in found if named is not None)[1]
