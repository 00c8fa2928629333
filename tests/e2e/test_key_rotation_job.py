"""CURVE key rotation under a running keyed job: the sessions job (tests/support/
sessions_job.py) on a real local Spark session, checkpointing every 0.3 s through
three nodes started by host (127.0.0.1 for the tasks, 127.0.0.2 their second node,
127.0.0.3 the root) from a topology naming the key directory. The nodes are restarted
one at a time after ``dstl keys rotate start``, after ``promote`` and after ``finish``
while the job runs; the job is restarted from its latest checkpoint after promote
(it then connects with the new writer key), as docs/deploy.md says. No checkpoint
fails, no task fails, no node refuses a client, and state and sink equal the batch
result."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.security import (
    finish_rotation,
    generate_key_dir,
    load_key_dir,
    promote_rotation,
    start_rotation,
)
from dstltree.sparkplug import FileSink, FileSource, StreamingJob
from dstltree.sparkplug.spark_session import spark_session
from dstltree.topology.config import load_topology
from tests.e2e.test_streaming_jobs import MAX_P, _check
from tests.support.sessions_job import Feeder, Sessions, read_events
from tests.support.tree_fixtures import write_topology
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]
HOSTS = {"a": "127.0.0.1", "b": "127.0.0.2", "root": "127.0.0.3"}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]", app="dstl-test-key-rotation")
    yield session
    session.stop()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bind(node_id: str) -> str:
    return f"tcp://{HOSTS[node_id]}:{_free_port(HOSTS[node_id])}"


class Progress:
    """The driver's progress hook: the completed and aborted checkpoints of the run."""

    def __init__(self) -> None:
        self.completed = 0
        self.aborted = 0

    def hook(self, driver: Any) -> None:
        stats = driver.coord.statistics()
        self.completed, self.aborted = stats.checkpoints_completed, stats.checkpoints_aborted


def _job(spark: Any, tmp: Path, topology: Path, progress: Progress) -> StreamingJob:
    job = StreamingJob(
        spark,
        name="sessions",
        checkpoint_dir=str(tmp / "checkpoints"),
        topology=str(topology),
        parallelism=2,
        max_parallelism=MAX_P,
        checkpoint_interval=0.3,
        materialization_interval=2.0,
        source_rate=80.0,
        batch_records=16,
        progress=progress.hook,
    )
    (
        job.source(FileSource(str(tmp / "in"), format="json"))
        .filter(lambda r: r["page"] != "")
        .key_by("user")
        .process(Sessions())
        .sink(FileSink(str(tmp / "out"), format="parquet"))
    )
    return job


class Run(threading.Thread):
    """One run of the job in the background (``result``, or ``error``)."""

    def __init__(self, job: StreamingJob, until: Any) -> None:
        super().__init__(name="job-run", daemon=True)
        self.job, self.until = job, until
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.job.run(until=self.until)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def _checkpoints(progress: Progress, run: Run, more: int) -> None:
    """Wait until ``more`` further checkpoints completed (the run still alive)."""
    mark = progress.completed

    def done() -> bool:
        assert run.is_alive(), f"the job run ended: {run.error!r}"
        return progress.completed >= mark + more

    wait_until(done, timeout=60, interval=0.05)


def _roll(tree: LocalTree, progress: Progress, run: Run, stopped: list[dict[str, Any]]) -> None:
    """Restart every node gracefully, one at a time, each after two more checkpoints;
    keep the final statistics of each stopped node."""
    for node_id in ("a", "b", "root"):
        _checkpoints(progress, run, 2)
        h = tree.nodes[node_id]
        h.process.terminate()
        h.process.wait(timeout=30)
        assert h.stats_file is not None
        stopped.append(json.loads(h.stats_file.read_text()))
        tree.start_node(node_id, h.address)
    _checkpoints(progress, run, 2)


@pytest.mark.timeout(600)
def test_a_keyed_job_keeps_checkpointing_through_a_key_rotation(spark: Any, tmp_path: Path) -> None:
    # 80 events/s, half of what the two tasks read at most: input arrives in every
    # phase however long the restarts take; the marker ends it once the rotation did
    feeder = Feeder(tmp_path / "in", per_file=40, every=0.5, seed=41)
    feeder.start()
    keys = tmp_path / "keys"
    generate_key_dir(keys)
    first_keys = load_key_dir(keys)
    nodes = [
        {"id": "root", "host": HOSTS["root"], "bind": _bind("root")},
        {"id": "a", "host": HOSTS["a"], "bind": _bind("a"), "parent": "root"},
        {"id": "b", "host": HOSTS["b"], "bind": _bind("b"), "parents": ["root", "a"]},
    ]
    topo_file = write_topology(
        tmp_path / "topology.yaml",
        str(tmp_path / "dfs"),
        nodes,
        persist_delay=0.02,
        parent_timeout=1.0,
        security={"keys": str(keys)},
    )
    tree = start_tree(load_topology(topo_file), topo_file, workdir=tmp_path / "nodes")
    stopped: list[dict[str, Any]] = []
    runs: list[Run] = []
    try:
        p1 = Progress()
        first = Run(_job(spark, tmp_path, topo_file, p1), until=None)
        runs.append(first)
        first.start()
        _checkpoints(p1, first, 3)
        start_rotation(keys)
        _roll(tree, p1, first, stopped)  # the nodes accept both generations
        promote_rotation(keys)
        first.job.stop()  # the job restarted: from its latest checkpoint, new keys
        first.join(timeout=120)
        assert not first.is_alive() and first.error is None, first.error
        p2 = Progress()
        second = Run(_job(spark, tmp_path, topo_file, p2), until="end")
        runs.append(second)
        second.start()
        _checkpoints(p2, second, 3)
        _roll(tree, p2, second, stopped)  # the nodes serve the new node key
        finish_rotation(keys)
        _roll(tree, p2, second, stopped)  # the nodes accept the new generation only
        feeder.finish()
        second.join(timeout=240)
        assert not second.is_alive() and second.error is None, second.error
    finally:
        feeder.finish()
        for r in runs:
            r.job.stop()
            r.join(timeout=120)
        tree.stop()

    assert load_key_dir(keys).node.public != first_keys.node.public
    for r in (first, second):
        assert r.result.recoveries == 0  # no task failed
        assert r.result.checkpoints_aborted == 0  # no checkpoint failed
    assert second.result.finished
    assert first.result.records + second.result.records == len(read_events(tmp_path / "in"))
    assert [s["auth_refusals"] for s in stopped] == [0] * 9  # no client refused
    # in each phase the tasks' segments reached their node (a, stopped first in each
    # roll), and children forwarded to the root with the keys of their phase
    assert [s["node_id"] for s in stopped] == ["a", "b", "root"] * 3
    assert all(s["bytes_own"] > 0 for s in stopped[::3])
    assert sum(s["bytes_received"] for s in stopped if s["node_id"] == "root") > 0
    _check(tmp_path)
