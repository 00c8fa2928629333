"""``dstl node``: the one entry point of a node process (the launchers start nodes
through it too: tests/integration/test_tree_integration.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dstltree.aggregator.launcher import start_tree
from dstltree.cli.app import app
from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.client.reader import read_changes
from dstltree.security import Curve, generate_key_dir, load_key_dir
from dstltree.topology.config import load_topology
from tests.support.waiting import wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_branching_topology_needs_depth_and_parent() -> None:
    result = CliRunner().invoke(
        app, ["node", "--topology", str(DEPLOY / "cluster.yaml"), "--node-id", "e0"]
    )
    assert result.exit_code == 2
    assert "--depth and --parent" in result.output


def test_unknown_node_is_named() -> None:
    result = CliRunner().invoke(
        app, ["node", "--topology", str(DEPLOY / "local.yaml"), "--node-id", "nope"]
    )
    assert result.exit_code == 2
    assert "'nope' is not in" in result.output


# -- a topology by host: each node started from the YAML alone ----------------------------

HOSTS = ["127.0.0.1", "127.0.0.2"]  # two "machines" on the loopback network


def _loopback_alias_or_skip() -> None:
    try:
        with socket.socket() as s:
            s.bind((HOSTS[1], 0))
    except OSError as e:
        pytest.skip(f"cannot bind {HOSTS[1]} on this OS ({e}); Linux routes all of 127/8")


def _common_free_port(hosts: list[str]) -> int:
    """A tcp port free on every host (the topology's one ``node_port``)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for h in hosts:
                with socket.socket() as s:
                    s.bind((h, port))
        except OSError:
            continue
        return port
    pytest.fail(f"no port free on all of {hosts}")


def _write_hosts_topology(tmp_path: Path, **fields: object) -> Path:
    doc = {
        "base_path": str(tmp_path / "dfs"),
        "hosts": HOSTS,
        "branching": 2,
        "node_port": _common_free_port(HOSTS),
        "persist_delay": 0.05,
        "parent_timeout": 2.0,
        # nodes by host need the cluster key directory (CURVE is on by default)
        "security": {"keys": str(tmp_path / "keys")},
        **fields,
    }
    if not (tmp_path / "keys").exists():
        generate_key_dir(tmp_path / "keys")
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _start(topology: Path, node_id: str, workdir: Path) -> subprocess.Popen[bytes]:
    """``dstl node --topology F --node-id ID`` and nothing else about where it runs."""
    cmd = [sys.executable, "-m", "dstltree.cli", "node", "--topology", str(topology)]
    cmd += ["--node-id", node_id, "--address-file", str(workdir / f"{node_id}.addr")]
    cmd += ["--stats-file", str(workdir / f"{node_id}.stats.json")]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
    addr = workdir / f"{node_id}.addr"
    wait_until(lambda: addr.exists() or proc.poll() is not None, timeout=30)
    assert proc.poll() is None, f"node {node_id} exited with code {proc.returncode}"
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _persist_one_checkpoint(base: str, node: str) -> ChangelogHandle:
    """One checkpoint through ``node`` with the writer keys of ``<base>/../keys``."""
    writer_keys = Curve.for_writer(load_key_dir(Path(base).parent / "keys"))
    client = ChangelogClient.open(base, node=node, ack_timeout=5.0, security=writer_keys)
    try:
        writer = client.create_writer("task0", range(4))
        for k in range(10):
            writer.append(k % 4, f"change-{k}".encode())
        return writer.persist_durably(0, checkpoint_id=1).result(timeout=30)
    finally:
        client.close()


def test_nodes_by_host_start_from_the_topology_alone(tmp_path: Path) -> None:
    _loopback_alias_or_skip()
    topology = _write_hosts_topology(tmp_path)
    topo = load_topology(topology)
    assert topo.node_for_host("127.0.0.2") == "n1" and topo.tree().parent("n1") == "n0"
    leaf = topo.host_nodes()["127.0.0.2"]
    procs = []
    try:
        for node_id in ("n0", "n1"):  # the root first; no --bind, --parent or --depth
            procs.append(_start(topology, node_id, tmp_path))
        for node_id in ("n0", "n1"):  # the address file holds the advertised endpoint
            assert (tmp_path / f"{node_id}.addr").read_text().strip() == topo.advertised(node_id)
        handle = _persist_one_checkpoint(str(tmp_path / "dfs"), leaf)
    finally:
        for proc in reversed(procs):
            _stop(proc)
    store = ObjectStore(str(tmp_path / "dfs"))
    got = sorted(c.decode() for kg in range(4) for c in read_changes(store, handle, kg))
    assert got == sorted(f"change-{k}" for k in range(10))
    root, below = (json.loads((tmp_path / f"{n}.stats.json").read_text()) for n in ("n0", "n1"))
    assert below["bytes_forwarded"] > 0 and below["objects_written"] == 0  # leaf -> root
    assert root["bytes_received"] > 0 and root["objects_written"] >= 1


def test_up_starts_a_loopback_host_topology_here(tmp_path: Path) -> None:
    """``dstl up``'s launcher: nodes on 127.0.0.x bind their own host, a wildcard bind
    (``bind_all``) narrowed to it, so the two nodes share the one port."""
    _loopback_alias_or_skip()
    topology = _write_hosts_topology(tmp_path, bind_all=True)
    topo = load_topology(topology)
    with start_tree(topo, topology, workdir=tmp_path / "nodes-wd") as running:
        assert {n: running.address(n) for n in ("n0", "n1")} == {
            "n0": topo.advertised("n0"),
            "n1": topo.advertised("n1"),
        }
        handle = _persist_one_checkpoint(str(tmp_path / "dfs"), running.address("n1"))
    assert len(handle.segments) >= 1


def test_up_refuses_hosts_of_other_machines() -> None:
    result = CliRunner().invoke(app, ["up", "--topology", str(DEPLOY / "cluster-hosts.yaml")])
    assert result.exit_code == 2
    assert "nodes[0].host" in result.output and "10.0.0.11" in result.output


def test_parent_without_advertised_endpoint_is_named(tmp_path: Path) -> None:
    topology = tmp_path / "t.yaml"
    topology.write_text(
        "nodes:\n  - {id: r, bind: auto}\n  - {id: a, bind: 'tcp://127.0.0.1:0', parent: r}\n"
    )
    result = CliRunner().invoke(app, ["node", "--topology", str(topology), "--node-id", "a"])
    assert result.exit_code == 2
    assert "node 'a'" in result.output and "nodes[0].bind" in result.output
