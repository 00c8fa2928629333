"""A Structured Streaming query on a Spark standalone cluster whose two workers stand
for two hosts, each with its own bridge (``DSTLTREE_BRIDGE_SOCKET`` in the worker's
environment, as a host sets it in ``spark-env.sh``), and the driver's host with a
third; all three write through the same nodes into one base path. Locality wait 0:
partitions move between the hosts from batch to batch (Spark keeps them where their
state is loaded otherwise), so each host's bridge finds files the other wrote through
its manifests and objects; one executor is also killed mid-batch. The result and the state read
back equal the batch answer, no state file is under the
checkpoint, both hosts' bridges wrote manifests, and ``dstl inspect`` finds no orphan
and no missing object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dstltree.cli.commands.inspect import inspect_base
from dstltree.storage.store import ObjectStore
from dstltree.structured_streaming import configure
from dstltree.structured_streaming.inventory import newest_manifests
from tests.integration.test_ss_cluster import (
    _executor_pids,
    _expected,
    _finish,
    _kill_mid_batch,
    _start,
    _state,
    _write_input,
)
from tests.support.ss_session import STATE_SUFFIXES, ss_builder, start_tree
from tests.support.standalone import standalone_cluster, submit_conf
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.standalone, pytest.mark.spark, pytest.mark.slow]

QUERY_TIMEOUT = 300.0  # seconds for the 8 batches, task retries included


def _check_answer(spark: Any, source: Path, checkpoint: Path, got: set[tuple]) -> None:
    """The sink's rows ``got`` and the state read back equal the batch answer, and the
    eighth batch is committed."""
    expected = _expected(spark, source)
    assert got == expected
    assert _state(spark, checkpoint) == expected
    assert (checkpoint / "commits" / "7").exists()


@contextmanager
def _two_hosts(
    tmp_path: Path, partitions: int, conf: dict[str, str], out: list[Any] | None = None
) -> Iterator[tuple[Any, Path]]:
    """A Spark session on a standalone cluster of two workers standing for two hosts,
    each with its own bridge, and the driver's host with a third, all on the same nodes:
    (the session, the tree's base path); ``out`` (if given) gets the services and the
    hosts' sockets. Everything is stopped on exit, the bridges writing their last
    manifests."""
    (tmp_path / "tree").mkdir()
    services = start_tree(tmp_path / "tree")  # the nodes and the driver's host's bridge
    base = Path(services.nodes.local_tree.topology.base_path)
    try:
        sockets = [tmp_path / f"host{i}" / "bridge.sock" for i in range(2)]
        for s in sockets:
            services.add_bridge(s)
        env = [{"DSTLTREE_BRIDGE_SOCKET": str(s)} for s in sockets]
        if out is not None:
            out += [services, sockets]
        with standalone_cluster(tmp_path, workers=2, worker_env=env) as cluster:
            builder = ss_builder(cluster.master_url, partitions=partitions)
            for k, v in submit_conf(cluster, conf).items():
                builder = builder.config(k, v)
            spark = configure(builder, socket=services.socket).getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            try:
                sc = spark.sparkContext._jsc.sc()
                wait_until(lambda: sc.getExecutorMemoryStatus().size() == 3, timeout=120.0)
                yield spark, base
            finally:
                spark.stop()
    finally:
        services.stop()


@pytest.mark.timeout(900)
def test_each_host_writes_through_its_own_bridge(tmp_path: Path) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(1, 9):
        _write_input(source, n)
    with _two_hosts(tmp_path, 4, {"spark.locality.wait": "0s"}) as (spark, base):
        app = spark.sparkContext.applicationId
        q = _start(spark, source, checkpoint, "hosts")
        killed = _kill_mid_batch(spark, checkpoint)
        got = _finish(spark, q, "hosts", timeout=QUERY_TIMEOUT)
        assert killed not in _executor_pids(app)
        expected = _expected(spark, source)
        assert got == expected
        assert _state(spark, checkpoint) == expected  # the statestore source
        assert (checkpoint / "commits" / "7").exists()
    assert [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)] == []
    partitions: dict[str, set[str]] = {}  # bridge -> state/<op>/<partition> it wrote in
    for m in base.glob("ss/*/manifest-*.json"):
        doc = json.loads(m.read_text())
        dirs = {"/".join(p.split("/")[:3]) for p in doc["files"]}
        partitions.setdefault(doc["bridge"], set()).update(dirs)
    writers = {b for b, dirs in partitions.items() if dirs}
    assert len(writers) >= 2, partitions  # both hosts' bridges wrote state files
    moved = set.intersection(*(partitions[b] for b in writers))
    assert moved, partitions  # a partition written on both hosts: it moved
    info = inspect_base(str(base), {})
    assert info["orphans"] == [] and info["missing"] == []


def _state_objects(base: Path) -> list[set[str]]:
    """The paths of Structured Streaming state files in each tree object under ``base``
    (objects holding none, e.g. only tombstones, are left out)."""
    from dstltree.client.reader import read_index

    store = ObjectStore(str(base))
    out = []
    for info in store.list_info(store.changelog_root()):
        if not info.url.endswith(".dstl") or info.size == 0:
            continue
        paths = {
            r.log_id.split("/", 2)[2]
            for r in read_index(store, info.url, verify=False)
            if r.log_id.startswith("ss/") and 0 in r.key_groups
        }
        if paths:
            out.append(paths)
    return out


@pytest.mark.timeout(900)
def test_a_batch_of_200_partitions_on_two_hosts_is_one_object(tmp_path: Path) -> None:
    """Issue 45: with the tasks on two executor hosts (each with its own bridge) and the
    driver on a third, every batch's state files, from both hosts, land in one tree
    object: the executors' bridges hold them and the driver's commit flushes them as
    one group (docs/structured-streaming.md, "Several hosts")."""
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    batches = 10
    for n in range(1, batches + 1):
        _write_input(source, n)
    with _two_hosts(tmp_path, 200, {}) as (spark, base):
        q = _start(spark, source, checkpoint, "wide")
        got = _finish(spark, q, "wide", timeout=QUERY_TIMEOUT)
        assert got == _expected(spark, source)
        assert _state(spark, checkpoint) == got
    assert [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)] == []
    objects = _state_objects(base)
    per_batch = len(objects) / batches
    print(f"tree objects holding state: {len(objects)} for {batches} batches ({per_batch:.2f})")
    assert per_batch <= 1.2, sorted(len(o) for o in objects)


RETAINED_BATCHES = 300


@pytest.mark.ss_faults
@pytest.mark.timeout(1500)
def test_300_batches_on_two_hosts_keep_only_what_spark_retains(tmp_path: Path) -> None:
    """Spark's retention on two hosts (``minBatchesToRetain=10``, a snapshot every 5
    changelogs): over 300 batches Spark deletes its old state files through the
    manager and the bridges' views keep only the small remainder Spark retains. After
    the run ``dstl inspect`` finds no orphan and no missing object, and the result and
    the state equal the batch answer. (An object
    holding several bridges' segments is released by the orphan sweep once an hour
    old, SHARED_ORPHAN_AGE, not at once: docs/structured-streaming.md, "Known
    limits".)"""
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(1, RETAINED_BATCHES + 1):
        _write_input(source, n)
    conf = {
        "spark.sql.streaming.minBatchesToRetain": "10",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "5",
        "spark.sql.streaming.stateStore.maintenanceInterval": "2s",
    }
    with _two_hosts(tmp_path, 4, conf) as (spark, base):
        for k, v in conf.items():
            spark.conf.set(k, v)
        q = _start(spark, source, checkpoint, "long")
        got = _finish(spark, q, "long", timeout=1200.0)
        assert got == _expected(spark, source)
        assert _state(spark, checkpoint) == got
        assert (checkpoint / "commits" / str(RETAINED_BATCHES - 1)).exists()
    assert [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)] == []
    info = inspect_base(str(base), {})
    assert info["orphans"] == [] and info["missing"] == []
    live, deleted = 0, 0
    for doc in newest_manifests(ObjectStore(str(base))):
        entries = doc["files"].values()
        deleted += sum(1 for e in entries if e["deleted"])
        live += sum(1 for e in entries if not e["deleted"])
    objects = _state_objects(base)
    print(f"after {RETAINED_BATCHES} batches: {live} live files, {deleted} deleted, "
          f"{len(objects)} tree objects holding state")  # fmt: skip
    # of the 1,200 changelogs alone written, what 10 retained versions need: Spark's
    # deletions reached the bridges' views (as tombstones, or pruned with the objects
    # released, so their count depends on where the tasks ran)
    assert live <= RETAINED_BATCHES // 2, live


@pytest.mark.ss_faults
@pytest.mark.timeout(900)
def test_a_worker_hosts_bridge_killed_while_holding_files_fails_the_batch_not_the_state(
    tmp_path: Path,
) -> None:
    """Issue 45: SIGKILL one executor host's bridge mid-batch, while it holds the batch's
    files, and start it again: that batch's commit fails (the holder is silent) or its
    files went elsewhere, the query started again from its checkpoint finishes, and the
    state read back equals the batch answer."""
    import os
    import signal

    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(1, 9):
        _write_input(source, n)
    parts: list[Any] = []
    with _two_hosts(tmp_path, 8, {}, parts) as (spark, base):
        services, sockets = parts
        q = _start(spark, source, checkpoint, "bridgekill")
        wait_until(lambda: (checkpoint / "commits" / "1").exists(), timeout=QUERY_TIMEOUT)
        victim = services.more_bridges[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(30)
        services.add_bridge(sockets[0])  # the host's bridge again, a new process
        ended = q.awaitTermination(QUERY_TIMEOUT)
        assert ended, "the query did not end in time"
        if q.exception() is not None:  # the commit of the batch in flight failed
            q = _start(spark, source, checkpoint, "bridgekill")
        got = _finish(spark, q, "bridgekill", timeout=QUERY_TIMEOUT)
        _check_answer(spark, source, checkpoint, got)
    assert inspect_base(str(base), {})["missing"] == []


@pytest.mark.ss_faults
@pytest.mark.timeout(600)
def test_the_demo_on_two_worker_hosts_survives_its_driver_killed_mid_batch(
    tmp_path: Path,
) -> None:
    """Issue 45: ``dstl demo --engine structured-streaming --hosts 2``: the query's
    executors on two worker hosts, each with its own bridge, the driver on a third,
    SIGKILLed mid-batch after 2 committed batches and started again from its
    checkpoint. State and sink equal the batch answer, no state file under the
    checkpoint, at most 1.2 tree objects holding state per batch, none orphaned or
    missing."""
    from tests.support.demo_run import run_demo_cli

    topology = tmp_path / "topology.yaml"
    topology.write_text(
        "base_path: dstl\nnodes:\n  - {id: root, bind: auto}\n"
        "  - {id: a, bind: auto, parent: root}\n  - {id: b, bind: auto, parent: root}\n"
    )
    r = run_demo_cli(
        tmp_path,
        str(tmp_path / "demo"),
        *("--engine", "structured-streaming", "--hosts", "2", "--source-rate", "0"),
        *("--topology", str(topology), "--shuffle-partitions", "20"),
        *("--kill-task-after", "2", "--limit-records", "20000", "--producer-seconds", "10"),
    )
    assert r["hosts"] == 2 and r["master"].startswith("spark://")
    assert r["state_matches_batch"], r["mismatched_keys"]
    assert r["sink_matches_batch"], r["mismatched_keys"]
    assert r["sink_duplicate_rows"] == 0 and r["records"] == 20_000
    assert r["killed"] is not None and r["killed"]["mid_batch"] and r["recoveries"] == 1
    assert r["state_files_ok"] and r["orphans"] == 0 and r["missing"] == 0
    assert r["objects_per_batch"] <= 1.2, r["objects_written"]


@pytest.mark.ss_faults
@pytest.mark.timeout(900)
def test_a_query_restarted_with_every_node_down_still_runs_and_reads_its_state(
    tmp_path: Path,
) -> None:
    """Issue 45: after four batches through the tree, every node stops; the query
    started again from its checkpoint runs the next four with the bridges alone (a hold
    nobody answers: each host's files durable at their close, written straight to the
    DFS), reads the state of the first four back from the tree, and its state equals the
    batch answer."""
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(1, 5):
        _write_input(source, n)
    parts: list[Any] = []
    with _two_hosts(tmp_path, 8, {}, parts) as (spark, base):
        services, _ = parts
        q = _start(spark, source, checkpoint, "nonodes")
        _finish(spark, q, "nonodes", timeout=QUERY_TIMEOUT)
        assert (checkpoint / "commits" / "3").exists()
        services.nodes.stop()  # every node of the tree
        for n in range(5, 9):
            _write_input(source, n)
        q = _start(spark, source, checkpoint, "nonodes")
        got = _finish(spark, q, "nonodes", timeout=QUERY_TIMEOUT)
        _check_answer(spark, source, checkpoint, got)
    assert inspect_base(str(base), {})["missing"] == []
