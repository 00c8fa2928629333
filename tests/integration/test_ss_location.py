"""Checkpoint locations that live in the tree alone (``dstl://<query>/``,
``DstlTreeFileSystem``): every file of the location (offsets, commits, the sources'
logs, metadata and state) goes through the bridge, nothing is written beside the
tree's objects and manifests, each batch's ``commits/<N>`` is in one object with the
batch's state files, and a query restarts from it.

On the local S3 server (moto), from this PySpark install, which has no Hadoop S3
connector: the nodes write the objects through s3fs. The driver runs in a process of
its own, is SIGKILLed inside a batch (after the state files, before the commit) and
is started again; its state then equals the batch answer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.client.reader import read_index
from dstltree.demo.ss_checks import (
    CheckpointLocation,
    checkpoint_figures,
    committed_batches,
    planned_batches,
)
from dstltree.storage.store import ObjectStore
from dstltree.structured_streaming.client import BridgeReader, BridgeRequestError
from dstltree.structured_streaming.configure import LocalServices, start_local
from dstltree.structured_streaming.view import query_key
from tests.support.ss_session import PROVIDERS, listed, ss_session, start_tree, write_json_input
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark

QUERY_TIMEOUT = 180.0  # seconds for one availableNow run
ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"k": f"k{i % 5}", "v": i * n} for i in range(30)]


def _answer(files: list[int]) -> list[list[Any]]:
    """The aggregation's answer over input files ``files``: [k, count, sum] sorted."""
    out: dict[str, list[int]] = {}
    for n in files:
        for r in _rows(n):
            c = out.setdefault(r["k"], [0, 0])
            c[0] += 1
            c[1] += r["v"]
    return sorted([k, c, s] for k, (c, s) in out.items())


def _run(spark: Any, source: Path, location: str) -> list[list[Any]]:
    from pyspark.sql import functions as F

    for k, v in PROVIDERS["rocksdb"].items():
        spark.conf.set(k, v)
    stream = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    )
    q = (
        stream.writeStream.outputMode("complete")
        .format("memory")
        .queryName("agg")
        .option("checkpointLocation", location)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "the query did not finish in time"
        assert q.exception() is None, q.exception()
        return sorted(list(r) for r in spark.sql("SELECT k, n, s FROM agg").collect())
    finally:
        q.stop()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    s = start_tree(tmp_path_factory.mktemp("tree"))
    try:
        yield s
    finally:
        s.stop()


def _objects(base: Path) -> list[Path]:
    return sorted(p for p in base.rglob("*.dstl") if p.stat().st_size > 0)


def test_a_dstl_location_is_the_trees_alone_and_restarts(
    services: LocalServices, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    location = f"dstl://q-{uuid.uuid4().hex[:12]}"
    for n in (1, 2, 3):
        write_json_input(source, n, _rows(n))
    base = Path(services.nodes.local_tree.topology.base_path)
    spark = ss_session(socket=services.socket)
    try:
        assert _run(spark, source, location) == _answer([1, 2, 3])
        assert listed(spark, location, "commits") == {"0", "1", "2"}
        assert listed(spark, location, "offsets") == {"0", "1", "2"}
        assert listed(spark, location, "sources/0") == {"0", "1", "2"}
        assert "metadata" in listed(spark, location, "")
    finally:
        spark.stop()
    # what tools outside Spark see of it, through the bridge
    with BridgeReader(services.socket) as bridge:
        commits, _ = bridge.listing(location, "commits")
        assert set(commits) == {"0", "1", "2"} and all(n > 0 for n in commits.values())
        walked = dict(bridge.walk(location))
        assert {"metadata", "offsets/2", "commits/2", "sources/0/2"} <= set(walked)
        assert any(p.startswith("state/0/") and p.endswith(".changelog") for p in walked)
        assert json.loads(bridge.read(location, "metadata"))["id"]
        with pytest.raises(BridgeRequestError) as refused:
            bridge.read(location, "commits/99")
        assert refused.value.code == "not-found"
    checkpoint = CheckpointLocation(location, services.socket)
    assert committed_batches(checkpoint) == 3 and planned_batches(checkpoint) == 3
    figures = checkpoint_figures(checkpoint)
    checkpoint.close()
    assert figures["plain_files"] == 0 and figures["checkpoint_files"] == len(walked)
    # nothing but the tree's objects and manifests was written anywhere
    written = {p.relative_to(base).parts[0] for p in base.rglob("*") if p.is_file()}
    assert written <= {"changelog", "ss"}, written
    # commits/<N> is in one object with the state files of its batch (version N + 1)
    store = ObjectStore(str(base))
    key = query_key(location)
    for n in (1, 2):
        holding = []
        for obj in _objects(base):
            ids = {r.log_id for r in read_index(store, str(obj))}
            if f"ss/{key}/commits/{n}" in ids:
                holding.append(ids)
        assert len(holding) == 1, holding
        state = {i for i in holding[0] if i.startswith(f"ss/{key}/state/0/")}
        assert any(i.endswith(f"/{n + 1}.changelog") for i in state), holding[0]

    write_json_input(source, 4, _rows(4))
    spark = ss_session(socket=services.socket)  # a new session: everything read back
    try:
        assert _run(spark, source, location) == _answer([1, 2, 3, 4])
        assert listed(spark, location, "commits") == {"0", "1", "2", "3"}
    finally:
        spark.stop()


def _driver(socket: Path, location: str, source: Path, out: Path, *mode: str) -> Any:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tests.support.ss_location_driver"]
    args = [str(socket), location, str(source), str(out), *mode]
    return subprocess.Popen([*cmd, *args], cwd=ROOT, env=env)


def test_a_query_checkpoints_to_s3_without_a_hadoop_connector_and_survives_a_kill(
    tmp_path: Path, s3: Any
) -> None:
    import pyspark

    jars = os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    assert not [j for j in jars if "hadoop-aws" in j or "hadoop-cloud" in j]
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        "base_path: dstl\npersist_delay: 0.02\nnodes:\n"
        "  - {id: root, bind: auto}\n  - {id: a, bind: auto, parent: root}\n"
    )
    base = f"{s3.base_url}/ckpt-{uuid.uuid4().hex[:8]}"
    services = start_local(topology, base_path=base, storage_options=s3.storage_options)
    source, out = tmp_path / "in", tmp_path / "out"
    location = "dstl://s3-query"
    for n in range(1, 6):
        write_json_input(source, n, _rows(n))
    try:
        proc = _driver(services.socket, location, source, out, "hang-at-3")
        try:
            wait_until(lambda: (out / "in-batch-3").exists() or proc.poll() is not None, 300)
            assert proc.poll() is None, "the driver ended before batch 3"
            os.kill(proc.pid, signal.SIGKILL)  # inside batch 3: state written, no commit
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        # three files in three batches (which three: the source's choice among equal times)
        assert {n for _, n, _ in json.loads((out / "result-2.json").read_text())} == {18}
        proc = _driver(services.socket, location, source, out)  # restarted
        try:
            assert proc.wait(timeout=QUERY_TIMEOUT) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        newest = max(int(p.stem.split("-")[1]) for p in out.glob("result-*.json"))
        assert newest == 4  # batch 3 ran again, then batch 4
        assert json.loads((out / f"result-{newest}.json").read_text()) == _answer([1, 2, 3, 4, 5])
        import s3fs

        fs = s3fs.S3FileSystem(**s3.storage_options)
        kinds = {p.split("/")[2] for p in fs.find(base.removeprefix("s3://"))}
        assert kinds == {"changelog", "ss"}, kinds
    finally:
        services.stop()


GOLDEN = ROOT / "tests" / "golden" / "ss-e9b3d4a"


def test_a_location_written_by_e9b3d4a_restores() -> None:
    """The checkpoint location and the tree e9b3d4a wrote (the metadata logs plain
    files, the state files in the tree, the bridge's manifests in format 2 naming
    objects by absolute path; tests/golden/make_ss_e9b3d4a.py), put back where it
    wrote them, restore: a fourth batch's answer counts the first three batches'."""
    from tests.golden.make_ss_e9b3d4a import PLACE, TOPOLOGY

    shutil.rmtree(PLACE, ignore_errors=True)
    shutil.copytree(GOLDEN, PLACE)
    checkpoint = str(PLACE / "checkpoint")
    try:
        write_json_input(PLACE / "in", 4, _rows(4))
        (PLACE / "topology.yaml").write_text(TOPOLOGY)
        services = start_local(PLACE / "topology.yaml", base_path=str(PLACE / "tree"))
        try:
            spark = ss_session(socket=services.socket)
            try:
                assert _run(spark, PLACE / "in", checkpoint) == _answer([1, 2, 3, 4])
                assert listed(spark, checkpoint, "commits") == {"0", "1", "2", "3"}
                state = spark.read.format("statestore").load(checkpoint).collect()
                assert len(state) == 5  # one row per key, read back from the tree
            finally:
                spark.stop()
        finally:
            services.stop()
        plain = [p.name for p in (PLACE / "checkpoint").rglob("*") if p.suffix == ".changelog"]
        assert plain == [], "state files stay in the tree"
    finally:
        shutil.rmtree(PLACE, ignore_errors=True)
