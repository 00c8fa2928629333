"""A task's or bridge's client talks to its nodes with the topology's link settings:
the wire versions it speaks, how often it pings a node and how long a silence it takes
for a lost node (``TopologyConfig.link_settings`` -> ``ChangelogClient.open``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dstltree.client import ChangelogClient
from dstltree.client.node_uploader import NodeUploader
from dstltree.client.wire import WIRE_VERSIONS
from dstltree.topology.config import load_topology


def _unused_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _uploader(client: ChangelogClient) -> NodeUploader:
    assert isinstance(client.uploader, NodeUploader)
    return client.uploader


def test_the_topology_settings_reach_the_node_uploader(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text(
        "wire_versions: [1]\nping_interval: 0.2\nliveness_timeout: 1.5\n"
        "nodes:\n  - {id: root, bind: auto}\n"
    )
    link = load_topology(topo).link_settings()
    assert link == {"wire_versions": (1,), "ping_interval": 0.2, "liveness_timeout": 1.5}
    client = ChangelogClient.open(str(tmp_path / "dfs"), node=_unused_endpoint(), **link)
    try:
        assert _uploader(client).wire_versions == (1,)
        assert _uploader(client)._timing == (0.2, 1.5)
    finally:
        client.close()


def test_without_settings_the_client_speaks_every_version_at_the_default_pace(
    tmp_path: Path,
) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text("nodes:\n  - {id: root, bind: auto}\n")
    link = load_topology(topo).link_settings()
    assert link == {"wire_versions": None, "ping_interval": 0.1, "liveness_timeout": 0.5}
    client = ChangelogClient.open(str(tmp_path / "dfs"), node=_unused_endpoint(), **link)
    try:
        assert _uploader(client).wire_versions == WIRE_VERSIONS
        assert _uploader(client)._timing == (0.1, 0.5)
    finally:
        client.close()


def test_a_liveness_timeout_below_the_ping_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="liveness"):
        ChangelogClient.open(
            str(tmp_path), node=_unused_endpoint(), ping_interval=1.0, liveness_timeout=0.5
        )
