"""A rolling upgrade of the tree under a running job, and a roll back (docs/design.md,
"Formats and compatibility"): the sessions job (tests/support/sessions_job.py) runs on
a real local Spark session through a DAG of 4 node processes (TOPOLOGY: the root, two
nodes below it, one below those with each as a parent; one task per node) while every
node, one at a time, is stopped (SIGTERM) and started again onto the settings of a
version that writes the newer object format (2), then, one at a time again, onto
those of the previous release (object format 1, wire version 1 only: no hello, no
pings). What a release does to its nodes, as Kafka and ZooKeeper roll their servers:
the job's writers and the other nodes work with nodes of either version beside them,
no checkpoint fails, and state and sink equal the batch result, restored from objects
of both formats."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dstltree.client.objectformat import FOOTER, FOOTER_SIZE, MAGIC
from dstltree.coordinator.cleanup import list_data_files
from dstltree.sparkplug import FileSink, FileSource, StreamingJob
from dstltree.sparkplug.spark_session import spark_session
from dstltree.storage.errors import StorageError
from dstltree.storage.store import ObjectStore
from tests.e2e.test_streaming_jobs import MAX_P, _check
from tests.support.sessions_job import Feeder, Sessions
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]
NODES = [
    {"id": "root", "bind": "auto"},
    {"id": "a", "bind": "auto", "parent": "root"},
    {"id": "b", "bind": "auto", "parents": ["root", "a"]},
    {"id": "c", "bind": "auto", "parents": ["a", "b"]},
]
TOPOLOGY = {"persist_delay": 0.05, "parent_timeout": 2.0, "nodes": NODES}
#: checkpoints completed after a node's restart before the next node is restarted
SETTLE_CHECKPOINTS = 3
STEP_TIMEOUT_S = 60.0

#: node settings per version: one that writes the newer object format, and the
#: previous release (wire version 1 only, object format 1); the job starts on this
#: release's defaults (wire versions 1 and 2, object format 1)
VERSIONS: dict[str, dict[str, Any]] = {
    "newer-format": {"object_format": 2},
    "previous": {"object_format": 1, "wire_versions": [1]},
}


class RollingUpgrade:
    """The driver's progress hook that rolls every node of the job's local tree onto
    each version of ``plan`` (keys of VERSIONS) in turn, one node at a time, leaves
    first: SIGTERM, then started again with the same id and endpoint from the job's
    topology with that version's settings (by the tree's
    supervisor when it has one, as the job's has), then
    SETTLE_CHECKPOINTS completed checkpoints before the next node. Runs on its own
    thread (a hook must return at once); ``done`` is set when the roll ended (``error``:
    why it stopped early) and then ``on_done`` runs (here: the input's end marker).
    ``probe`` (a Counter) runs after each restart; ``probes``: per version of ``plan``,
    the most it counted at once during that version's roll."""

    def __init__(self, plan: list[str], on_done: Any, probe: Any) -> None:
        self.plan = plan
        self.on_done = on_done
        self.probe = probe
        self.probes: list[Any] = []
        self.restarts: list[tuple[str, str, int]] = []  # (node, version, new pid)
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def hook(self, driver: Any) -> None:
        if self._thread is None and getattr(driver.nodes, "local_tree", None) is not None:
            self._thread = threading.Thread(target=self._run, args=(driver,), daemon=True)
            self._thread.start()

    def _run(self, driver: Any) -> None:
        try:
            self._settle(driver)
            for version in self.plan:
                self.probes.append(Counter())
                self._roll(driver, version)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.done.set()
            self.on_done()

    def _roll(self, driver: Any, version: str) -> None:
        tree = driver.nodes.local_tree
        # the job's topology file as the job wrote it (its base path, its keys), with
        # the version's settings: what nodes started from now on read
        doc = yaml.safe_load(tree.topology_file.read_text())
        doc.update(VERSIONS[version])
        topology = tree.topology_file.with_name(f"topology-{version}.yaml")
        topology.write_text(yaml.safe_dump(doc))
        tree.topology_file = topology
        for node_id in tree.tree.post_order():
            old = tree.nodes[node_id]
            old.process.terminate()
            old.process.wait(timeout=STEP_TIMEOUT_S)
            if tree.supervisor is None:
                tree.start_node(node_id, old.address)
            else:  # the job's supervisor starts it again (from tree.topology_file)
                wait_until(lambda n=node_id, o=old: tree.nodes[n] is not o, timeout=STEP_TIMEOUT_S)
            new = tree.nodes[node_id]
            assert new.process.poll() is None and new.address == old.address
            self.restarts.append((node_id, version, new.pid))
            self._settle(driver)
            self.probes[-1] |= self.probe()  # the most seen at once during this roll

    def _settle(self, driver: Any) -> None:
        start = driver.coord.statistics().checkpoints_completed
        wait_until(
            lambda: driver.coord.statistics().checkpoints_completed >= start + SETTLE_CHECKPOINTS,
            timeout=STEP_TIMEOUT_S,
        )


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[4]", app="dstl-test-rolling-upgrade")
    yield session
    session.stop()


def _job(spark: Any, tmp: Path, progress: Any) -> StreamingJob:
    topology = tmp / "topology.yaml"
    topology.write_text(yaml.safe_dump(TOPOLOGY))
    job = StreamingJob(
        spark,
        name="sessions",
        checkpoint_dir=str(tmp / "checkpoints"),
        parallelism=4,
        max_parallelism=MAX_P,
        checkpoint_interval=0.3,
        materialization_interval=2.0,
        topology=str(topology),
        progress=progress,
        source_rate=40.0,  # records per second and task
    )
    (
        job.source(FileSource(str(tmp / "in"), format="json"))
        .filter(lambda r: r["page"] != "")
        .key_by("user")
        .process(Sessions())
        .sink(FileSink(str(tmp / "out"), format="parquet"))
    )
    return job


def _object_formats(tmp: Path) -> Counter[int]:
    """Objects of the job's changelog by the format version in their footer."""
    store = ObjectStore(str(tmp / "checkpoints" / "sessions"))
    formats: Counter[int] = Counter()
    for path in list_data_files(store):
        if "/changelog/" not in path or path.endswith(".tmp"):
            continue
        try:  # the registry deletes objects while the job runs
            size = store.size(path)
            at = size - FOOTER_SIZE
            tail = store.read_range(path, at, FOOTER_SIZE) if at >= 0 else b""
        except StorageError:
            continue
        if len(tail) == FOOTER_SIZE:  # not a reservation (an empty object file)
            magic, version = FOOTER.unpack(tail)[:2]
            formats[version if magic == MAGIC else -1] += 1
    return formats


@pytest.mark.timeout(600)
def test_nodes_rolled_onto_the_next_version_and_back_under_a_running_job(
    spark: Any, tmp_path: Path
) -> None:
    # 100 events/s, below the 160/s the four tasks read at most: input arrives during
    # every restart however long the roll takes; the marker ends it once the roll did
    feeder = Feeder(tmp_path / "in", per_file=50, every=0.5, seed=37)
    roll = RollingUpgrade(
        ["newer-format", "previous"],
        on_done=feeder.finish,
        probe=lambda: _object_formats(tmp_path),
    )
    feeder.start()
    try:
        result = _job(spark, tmp_path, roll.hook).run(until="end")
    finally:
        feeder.finish()
    assert roll.done.is_set() and roll.error is None, f"the roll stopped: {roll.error!r}"
    nodes = len(NODES)
    assert [t for _, t, _ in roll.restarts] == ["newer-format"] * nodes + ["previous"] * nodes
    assert result.finished and result.recoveries == 0
    assert result.run.stats.checkpoints_aborted == 0, "a checkpoint failed during the roll"
    newer, previous = roll.probes
    assert newer[2] > 0, f"no node wrote the newer format: {dict(newer)}"
    assert previous[1] > 0, f"no node of the previous release wrote: {dict(previous)}"
    assert -1 not in newer and -1 not in previous
    _check(tmp_path)  # state restored across both formats, sink exactly once
