"""A Structured Streaming query on a Spark standalone cluster whose two workers stand
for two hosts, each with its own bridge (``DSTLTREE_BRIDGE_SOCKET`` in the worker's
environment, as a host sets it in ``spark-env.sh``), and the driver's host with a
third; all three write through the same nodes into one base path. One executor is
killed mid-batch: its partitions move to the other host, whose bridge finds their
files through the first host's manifests and objects. The result and the state read
back through the driver's bridge equal the batch answer, no state file is under the
checkpoint, both hosts' bridges wrote manifests, and ``dstl inspect`` finds no orphan
and no missing object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstltree.cli.commands.inspect import inspect_base
from dstltree.structured_streaming import configure
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


@pytest.mark.timeout(900)
def test_each_host_writes_through_its_own_bridge(tmp_path: Path) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(1, 9):
        _write_input(source, n)
    services = start_tree(tmp_path / "tree")  # the nodes and the driver's host's bridge
    base = Path(services.nodes.local_tree.topology.base_path)
    try:
        sockets = [tmp_path / f"host{i}" / "bridge.sock" for i in range(2)]
        for s in sockets:
            services.add_bridge(s)
        env = [{"DSTLTREE_BRIDGE_SOCKET": str(s)} for s in sockets]
        with standalone_cluster(tmp_path, workers=2, worker_env=env) as cluster:
            builder = ss_builder(cluster.master_url, partitions=4)
            for k, v in submit_conf(cluster).items():
                builder = builder.config(k, v)
            spark = configure(builder, socket=services.socket).getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            try:
                app = spark.sparkContext.applicationId
                wait_until(lambda: len(_executor_pids(app)) == 2, timeout=120.0, interval=0.2)
                q = _start(spark, source, checkpoint, "hosts")
                killed = _kill_mid_batch(spark, checkpoint)
                got = _finish(spark, q, "hosts", timeout=QUERY_TIMEOUT)
                assert killed not in _executor_pids(app)
                expected = _expected(spark, source)
                assert got == expected
                assert _state(spark, checkpoint) == expected  # the statestore source
                assert (checkpoint / "commits" / "7").exists()
            finally:
                spark.stop()
    finally:
        services.stop()  # every bridge writes its last manifest
    assert [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)] == []
    writers = {
        json.loads(m.read_text())["bridge"]
        for m in base.glob("ss/*/manifest-*.json")
        if json.loads(m.read_text())["files"]
    }
    assert len(writers) >= 2, writers  # both hosts' bridges wrote state files
    info = inspect_base(str(base), {})
    assert info["orphans"] == [] and info["missing"] == []
