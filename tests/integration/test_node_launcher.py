"""The node launcher (sparkplug.nodes.executor_nodes) on a real ``local-cluster``:
it places one node per executor its barrier stage ran on, whatever count the caller
took before from another registry. A job on a busy cluster stopped before its first
checkpoint with "the node launcher reached 2 of 1 executors": the block manager's
registry had counted one executor while the scheduler already offered two."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from dstltree.sparkplug.nodes import executor_nodes
from dstltree.sparkplug.spark_session import spark_session
from dstltree.topology.config import load_topology
from tests.support.tree_fixtures import write_topology

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_a_stale_executor_count_does_not_fail_the_launch(tmp_path: Path) -> None:
    topo_file = write_topology(tmp_path / "t.yaml", str(tmp_path / "dfs"), [{"id": "a"}])
    topo = load_topology(topo_file)
    spark = spark_session("local-cluster[2,1,1024]", "node-launcher")
    try:
        sc = spark.sparkContext
        placement = executor_nodes(sc, topo, 1, str(tmp_path / "dfs"), {}, curve=False)
        try:
            assert placement.count == 2 and len(placement.node_for_executor) == 2
            for address in placement.node_for_executor.values():
                _answers(address)
        finally:
            placement.stop()
    finally:
        spark.stop()


def _answers(address: str) -> None:
    """The node at ``address`` takes a connection and answers a ping (a version-2
    hello first), within 30 s."""
    from dstltree.client.wire import WIRE_VERSIONS, Ping, WireHello, dump, load

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)
    try:
        sock.connect(address)
        sock.send_multipart(dump(WireHello(WIRE_VERSIONS)))
        sock.send_multipart(dump(Ping(1)))
        kinds = {type(load(sock.recv_multipart(), versions=WIRE_VERSIONS)) for _ in range(2)}
        assert WireHello in kinds, kinds
    finally:
        sock.close(0)
