"""Prometheus metrics of nodes and coordinator, and ``dstl status``, over loopback with
free ports: what the scraped text shows after real persists through a tree."""

from __future__ import annotations

import math
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from dstltree.aggregator.metrics import NodeMetrics, metrics_port_for
from dstltree.aggregator.node import Node
from dstltree.aggregator.process import build_node
from dstltree.cli.commands import status as status_command
from dstltree.cli.commands._status_job import job_rows, job_table
from dstltree.cli.commands.status import p99_from_buckets
from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.coordinator import (
    ApplyMaterialization,
    Coordinator,
    Materialize,
    MaterializedRef,
    TaskCheckpoint,
    TaskLink,
    TriggerCheckpoint,
)
from dstltree.topology.config import parse_topology
from tests.support.tree_fixtures import THREE_NODES, start
from tests.support.waiting import wait_until

WRITERS_PER_LEAF = 2


def scrape(url: str) -> dict[str, float]:
    """Sample name (with labels other than ``node``) -> value."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "node")
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


class MetricsTree:
    """The nodes of a topology as threads of this process, each serving metrics on a
    free loopback port."""

    def __init__(self, topo, store: ObjectStore) -> None:  # type: ignore[no-untyped-def]
        self.tree = topo.tree()
        self.nodes: dict[str, Node] = {}
        for nid in self.tree.nodes:
            parent = self.tree.parent(nid)
            metrics = NodeMetrics(nid, 0)
            node = build_node(
                topo,
                nid,
                self.tree.depth(nid),
                "tcp://127.0.0.1:0",
                self.nodes[parent].address if parent else None,
                store=store,
                metrics=metrics,
            )
            node.start()
            self.nodes[nid] = node

    def url(self, nid: str) -> str:
        m = self.nodes[nid].metrics
        assert m is not None and m.url is not None
        return m.url

    def stop(self) -> None:
        for n in self.nodes.values():
            n.stop()


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[MetricsTree, str]]:
    base = str(tmp_path / "dfs")
    topo = parse_topology(
        {
            "base_path": base,
            "nodes": THREE_NODES,
            "target_object_bytes": 1 << 20,
            "persist_delay": 0.05,
            "parent_timeout": 2.0,
            "metrics_port": 0,
        }
    )
    t = MetricsTree(topo, ObjectStore(base))
    try:
        yield t, base
    finally:
        t.stop()


def _persist(t: MetricsTree, base: str, checkpoints: int) -> dict[str, ChangelogHandle]:
    """``checkpoints`` checkpoints of 2 writers on each leaf; every writer's last handle
    (from SQN 0: all its segments), by log id."""
    handles: dict[str, ChangelogHandle] = {}
    clients = [ChangelogClient.open(base, node=t.nodes[n].address, ack_timeout=5.0) for n in "ab"]
    try:
        writers = [
            c.create_writer(f"{n}-w{k}", range(4))
            for n, c in zip("ab", clients, strict=True)
            for k in range(WRITERS_PER_LEAF)
        ]
        for cp in range(1, checkpoints + 1):
            for i, w in enumerate(writers):
                w.append(i % 4, f"cp{cp}-w{i}".encode() * 100)
            for f in [w.persist_durably(0, checkpoint_id=cp) for w in writers]:
                h = f.result(timeout=20)
                handles[h.log_id] = h
    finally:
        for c in clients:
            c.close()
    return handles


def store_objects(base: str) -> list[str]:
    return ObjectStore(base).list_objects()


def _total(t: MetricsTree, name: str) -> float:
    return sum(scrape(t.url(n)).get(name, 0.0) for n in t.nodes)


def test_node_metrics_show_dfs_requests_after_persists(tree: tuple[MetricsTree, str]) -> None:
    t, base = tree
    handles = _persist(t, base, 3)
    # a node counts an object, its segments and bytes in the step that records its DFS
    # request, before any of its items is acked: once the persists are back, one scrape
    # of each node shows them all, no wait
    got = [scrape(t.url(n)) for n in t.nodes]

    def total(name: str) -> float:
        return sum(s.get(name, 0.0) for s in got)

    objects = total("dstl_objects_written_total")
    assert objects >= 1
    assert total("dstl_dfs_request_size_bytes_count") == objects
    assert total("dstl_dfs_request_latency_seconds_count") == objects
    assert total("dstl_dfs_request_segments_count") == objects
    # every segment written (4 writers x 3 checkpoints) is in some request
    assert total("dstl_dfs_request_segments_sum") == total("dstl_segments_written_total") == 4 * 3
    segment_bytes = sum(s.length for h in handles.values() for s in h.segments)
    assert len(store_objects(base)) == objects
    assert total("dstl_dfs_request_size_bytes_sum") == segment_bytes
    assert total("dstl_bytes_written_total") == segment_bytes
    assert total("dstl_dfs_errors_total") == 0
    assert total("dstl_dfs_request_latency_seconds_sum") > 0
    # without plans yet the leaves forward to the root, which writes
    own = sum(s.length for h in handles.values() if h.log_id.startswith("a-") for s in h.segments)
    assert len({s.path for h in handles.values() for s in h.segments}) == objects
    # the other counters follow the node's statistics every ~0.5 s: wait for the leaf's
    # to show all of its own writers' bytes forwarded
    wait_until(lambda: scrape(t.url("a")).get("dstl_bytes_forwarded_total") == own, timeout=10)
    leaf = scrape(t.url("a"))
    assert "dstl_queued_bytes" in leaf and "dstl_writes_for_window" in leaf
    assert "dstl_dfs_retries_total" in leaf and "dstl_dfs_hedged_attempts_total" in leaf


def test_metrics_without_server_still_record() -> None:
    m = NodeMetrics("x", None)
    assert m.url is None and m.port is None
    m.observe_upload(2048, 3, 0.02, ok=False)
    assert m.registry.get_sample_value("dstl_dfs_errors_total", {"node": "x"}) == 1
    assert m.registry.get_sample_value("dstl_dfs_request_segments_sum", {"node": "x"}) == 3
    m.close()


def test_metrics_ports_from_topology() -> None:
    nodes = [
        {"id": "r"},
        {"id": "a", "parent": "r"},
        {"id": "b", "parent": "r"},
        {"id": "a1", "parent": "a"},
    ]
    topo = parse_topology({"nodes": nodes, "metrics_port": 9400})
    assert [metrics_port_for(topo, n) for n in ("r", "a", "b", "a1")] == [9400, 9401, 9402, 9403]
    assert metrics_port_for(parse_topology({"nodes": nodes, "metrics_port": 0}), "a1") == 0
    assert metrics_port_for(parse_topology({"nodes": nodes}), "a1") is None
    kary = parse_topology({"branching": 2, "metrics_port": 9500})
    assert metrics_port_for(kary, "e5") == 9505


def test_node_processes_publish_metrics_url_and_status_reads_address_files(
    tmp_path: Path,
) -> None:
    with start(tmp_path, metrics_port=0) as running:
        for nid, h in running.nodes.items():
            assert h.address.startswith("tcp://")
            url = running.metrics_url(nid)
            assert url is not None and url.startswith("http://127.0.0.1:")
            assert "dstl_queued_bytes" in scrape(url)
        args = ["status", "--topology", str(tmp_path / "topology.yaml"), "--once"]
        res = runner.invoke(status_app(), [*args, "--workdir", str(tmp_path)])
        assert res.exit_code == 0, res.output
        assert "3/3 nodes up" in res.output
        running.nodes["b"].kill()
        res = runner.invoke(status_app(), [*args, "--workdir", str(tmp_path)])
        assert res.exit_code == 0, res.output
        assert "2/3 nodes up" in res.output
        assert _row(res.output, "b").split()[2] == "down"


# -- coordinator -----------------------------------------------------------------------


def _task(address: str, base: str, task: int, stop: threading.Event, errors: list) -> None:  # type: ignore[type-arg]
    """A task appending records, acking checkpoints and materializing on command."""
    try:
        client = ChangelogClient.open(base)
        writer = client.create_writer(f"task-{task}", range(task * 2, task * 2 + 2))
        link = TaskLink(address, task, 0)
        offset, materialized, after = 0, None, writer.next_sqn()
        while not stop.is_set():
            writer.append(task * 2 + offset % 2, str(offset).encode() * 10)
            offset += 1
            for cmd in link.poll(timeout=0.002):
                if isinstance(cmd, TriggerCheckpoint):
                    h = writer.persist_durably(after).result(timeout=10)
                    tc = TaskCheckpoint(task, 0, offset, materialized, (h,))
                    link.ack_checkpoint(cmd.checkpoint_id, tc)
                elif isinstance(cmd, Materialize):
                    sqn, path = writer.next_sqn(), client.store.new_snapshot_path()
                    size = client.store.put(path, str(offset).encode())
                    link.report_materialization(cmd.epoch, MaterializedRef(path, sqn, size))
                elif isinstance(cmd, ApplyMaterialization):
                    materialized, after = cmd.ref, cmd.ref.sqn
                    writer.truncate(cmd.ref.sqn)
        link.close()
        client.close()
    except BaseException as e:  # noqa: BLE001 - reported to the test thread
        errors.append(e)


def test_coordinator_metrics_show_checkpoints_and_materializations(tmp_path: Path) -> None:
    base = str(tmp_path)
    coord = Coordinator(
        ObjectStore(base),
        2,
        checkpoint_interval=0.05,
        materialization_interval=0.3,
        checkpoint_timeout=5.0,
        metrics_port=0,
    )
    coord.start()
    assert coord.metrics is not None and coord.metrics.url is not None
    url = coord.metrics.url
    coord.begin_attempt(0)
    stop, errors = threading.Event(), []  # type: ignore[var-annotated]
    threads = [
        threading.Thread(target=_task, args=(coord.address, base, t, stop, errors))
        for t in range(2)
    ]
    for th in threads:
        th.start()
    try:
        wait_until(
            lambda: (
                bool(errors)
                or scrape(url).get("dstl_checkpoints_completed_total", 0) >= 4
                and scrape(url).get("dstl_materializations_completed_total", 0) >= 1
            ),
            timeout=20,
        )
        got = scrape(url)
        rows = dict(job_rows(status_command.scrape(url)))  # what dstl status --coordinator shows
    finally:
        stop.set()
        for th in threads:
            th.join(10)
        coord.stop()
    assert not errors, errors
    stats = coord.statistics()
    assert got["dstl_checkpoint_duration_seconds_count"] == got["dstl_checkpoints_completed_total"]
    assert got["dstl_checkpoint_size_bytes_count"] == got["dstl_checkpoints_completed_total"]
    assert got["dstl_checkpoint_sync_seconds_count"] == got["dstl_checkpoints_completed_total"]
    assert got["dstl_checkpoint_async_seconds_count"] == got["dstl_checkpoints_completed_total"]
    assert len(stats.checkpoint_phases_s) == stats.checkpoints_completed
    assert int(rows["checkpoints completed / aborted"].split(" / ")[0]) >= 4
    assert int(rows["materializations"]) >= 1
    for figure in ("duration p50 / p99", "  sync / async phase p99", "materialization p99"):
        assert rows[figure].endswith(" ms"), (figure, rows[figure])
    # each task appends a change of >= 10 bytes before it acks any checkpoint: every
    # checkpoint adds one new segment of at least that per task
    completed = got["dstl_checkpoints_completed_total"]
    assert got["dstl_checkpoint_size_bytes_sum"] >= completed * 2 * 10
    assert got["dstl_last_checkpoint_id"] >= completed  # ids count from 1
    # a materialization: both tasks' snapshots (their offsets as text, >= 1 byte each)
    materialized = got["dstl_materialization_duration_seconds_count"]
    assert materialized >= 1
    assert got["dstl_materialization_size_bytes_count"] == materialized
    assert got["dstl_materialization_size_bytes_sum"] >= 2 * materialized
    # whole snapshots (no parts): every byte written for its epoch
    assert got["dstl_materialization_written_bytes_count"] == materialized
    assert (
        got["dstl_materialization_written_bytes_sum"] == got["dstl_materialization_size_bytes_sum"]
    )
    assert [m[1] for m in stats.materializations][: int(materialized)] == [
        m[2] for m in stats.materializations
    ][: int(materialized)]
    assert got["dstl_checkpoints_completed_total"] <= stats.checkpoints_completed
    assert got["dstl_messages_rejected_total"] == 0
    # stopped: the server is gone
    with pytest.raises(OSError):
        scrape(url)


def test_coordinator_metrics_off_by_default(tmp_path: Path) -> None:
    coord = Coordinator(ObjectStore(str(tmp_path)), 1)
    assert coord.metrics is None
    coord.stop()


# -- dstl status -----------------------------------------------------------------------


runner = CliRunner()


def status_app() -> typer.Typer:
    app = typer.Typer()
    status_command.register(app)
    app.command("noop", hidden=True)(lambda: None)  # keep "status" a sub-command
    return app


def _answers(url: str) -> bool:
    try:
        scrape(url)
    except OSError:
        return False
    return True


def _row(output: str, node_id: str) -> str:
    """The table line of ``node_id`` with rich's borders removed."""
    for line in output.splitlines():
        cells = line.replace("│", " ").replace("┃", " ").split()
        if cells and cells[0] == node_id:
            return " ".join(cells)
    raise AssertionError(f"no row for {node_id!r} in:\n{output}")


def test_status_lists_every_node_and_marks_a_stopped_one_down(
    tree: tuple[MetricsTree, str], tmp_path: Path
) -> None:
    t, base = tree
    _persist(t, base, 2)
    assert _total(t, "dstl_objects_written_total") >= 1  # counted before the acks
    topo_file = tmp_path / "topo.yaml"
    topo_file.write_text(yaml.safe_dump({"base_path": base, "nodes": THREE_NODES}))
    eps = ",".join(f"{n}={t.url(n)}" for n in t.nodes)
    args = ["status", "--topology", str(topo_file), "--endpoints", eps, "--once"]
    res = runner.invoke(status_app(), args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "3/3 nodes up" in res.output
    root = _row(res.output, "root").split()
    assert root[1:3] == ["-", "root"]
    assert int(root[5]) >= 1  # objects written: the root writes without plans
    assert root[-2] == "ms" and root[-1] == "0"  # a p99 latency, no errors
    for leaf in ("a", "b"):
        assert _row(res.output, leaf).split()[1:3] in (["root", "forwarder"], ["root", "writer"])
    url_b = t.url("b")
    t.nodes["b"].stop()  # the node closes its metrics server when its loop ends
    wait_until(lambda: not _answers(url_b))
    res = runner.invoke(status_app(), args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "2/3 nodes up" in res.output
    assert _row(res.output, "b").split()[1:3] == ["root", "down"]


def test_status_shows_nodes_down_when_nothing_listens(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free now; nodes would listen on port + k
    topo_file = tmp_path / "topo.yaml"
    topo_file.write_text(yaml.safe_dump({"nodes": THREE_NODES, "metrics_port": port}))
    res = runner.invoke(
        status_app(), ["status", "--topology", str(topo_file), "--once", "--timeout", "0.5"]
    )
    assert res.exit_code == 0, res.output
    assert "0/3 nodes up" in res.output
    no_port = tmp_path / "no_port.yaml"
    no_port.write_text(yaml.safe_dump({"nodes": THREE_NODES}))
    res = runner.invoke(status_app(), ["status", "--topology", str(no_port), "--once"])
    assert res.exit_code != 0 and "metrics_port" in res.output


def test_status_says_when_the_coordinator_does_not_answer() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused at once
        table = job_table(f"http://127.0.0.1:{port}/metrics", 0.5)
    assert "not answering" in str(table.title) and table.row_count == 0


def test_p99_from_histogram_buckets() -> None:
    assert p99_from_buckets([(1.0, 0.0), (math.inf, 0.0)]) is None
    # 100 observations: 50 in (0, 0.1], 50 in (0.1, 1]: p99 at 98/100 of the second bucket
    got = p99_from_buckets([(0.1, 50.0), (1.0, 100.0), (math.inf, 100.0)])
    assert got == pytest.approx(0.1 + 0.9 * 49 / 50)
    assert p99_from_buckets([(0.1, 1.0), (math.inf, 10.0)]) == 0.1  # in +Inf: largest bound
