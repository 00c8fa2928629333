"""The main job on a Spark standalone cluster of separate processes, as users run it: a
master and two workers on their own loopback addresses standing for hosts
(tests/support/standalone.py), one aggregator node per worker host started by
``dstl node --topology F --node-id ID`` from a topology by host, and the job sent with
``spark-submit --master spark://...``. Mid-run an executor JVM is killed hard (the job
restarts its stage from the latest checkpoint), then the node of one host (its tasks
write straight to the DFS from then on): the result still matches the batch, key by key,
and every sink row is visible once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dstltree.coordinator.cleanup import normalize
from dstltree.coordinator.store import CheckpointStore
from dstltree.security import generate_key_dir
from dstltree.storage.store import ObjectStore
from tests.support.demo_run import ROOT, RUN_ID, checkpoint_dir, run_prefix
from tests.support.standalone import StandaloneCluster, standalone_cluster, start_submit
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.standalone, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("demo-cluster"), workers=2) as c:
        yield c


def _free_port_on(hosts: list[str]) -> int:
    """A port free on every host (tried in turn; bounded)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for h in hosts[1:]:
                with socket.socket() as t:
                    t.bind((h, port))
            return port
        except OSError:
            continue
    raise AssertionError(f"no common free port on {hosts}")


def _topology(tmp_path: Path, hosts: list[str], base: str) -> Path:
    doc = {
        "hosts": hosts,
        "branching": 2,
        "node_port": _free_port_on(hosts),
        "base_path": base,
        "target_object_bytes": "4MiB",
        "persist_delay": 0.05,
        "parent_timeout": 2.0,
        # CURVE (the default): nodes by host read the cluster key directory
        "security": {"keys": str(generate_key_dir(tmp_path / "keys").directory)},
    }
    f = tmp_path / "topology.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def _start_nodes(topology: Path, ids: list[str], tmp_path: Path) -> dict[str, subprocess.Popen]:  # type: ignore[type-arg]
    procs = {}
    for node_id in ids:
        cmd = [sys.executable, "-m", "dstltree.cli.app", "node", "--topology", str(topology)]
        cmd += ["--node-id", node_id, "--address-file", str(tmp_path / f"{node_id}.addr")]
        procs[node_id] = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL)
    for node_id in ids:
        wait_until(lambda n=node_id: (tmp_path / f"{n}.addr").exists(), timeout=60)
    return procs


def _stop(job: subprocess.Popen, nodes: list[subprocess.Popen]) -> None:  # type: ignore[type-arg]
    """Stop spark-submit's process group and the nodes by PID: SIGTERM, then SIGKILL."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGTERM)
    for p in nodes:
        if p.poll() is None:
            p.terminate()
    for p in [job, *nodes]:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL) if p is job else p.kill()
            p.wait(timeout=10)


def _latest(base: Path) -> Any:
    return CheckpointStore(ObjectStore(checkpoint_dir(str(base)))).load_latest()


@pytest.mark.timeout(900)  # its waits (240 + 240 + 400 s) bound it: one took 281 s loaded
def test_demo_submitted_to_a_standalone_cluster_survives_executor_and_node_kills(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    hosts = list(cluster.worker_hosts)
    base = tmp_path / "demo"
    topology = _topology(tmp_path, hosts, run_prefix(str(base)) + "/checkpoints")
    nodes = _start_nodes(topology, ["n0", "n1"], tmp_path)
    report = tmp_path / "report.json"
    args = [str(ROOT / "cli" / "app.py"), "demo", "--master", cluster.master_url]
    args += ["--topology", str(topology), "--base-path", str(base), "--report", str(report)]
    args += ["--run-id", RUN_ID]
    args += ["--tasks", "2", "--limit-records", "30000", "--producer-seconds", "30"]
    args += ["--kill-task-after", "0", "--materialization-interval", "1.0"]
    job = start_submit(cluster, args, tmp_path / "submit.log")
    try:
        wait_until(lambda: (cp := _latest(base)) is not None and cp.checkpoint_id >= 3, 240, 0.2)
        cluster.kill_executor(hosts[1])  # hard: the JVM and its Python workers
        wait_until(lambda: _latest(base).attempt >= 1, timeout=240, interval=0.2)
        nodes["n1"].send_signal(signal.SIGKILL)  # the node of host 2 dies mid-run
        assert job.wait(timeout=400) == 0, (tmp_path / "submit.log").read_text()[-4000:]
    finally:
        _stop(job, list(nodes.values()))
    r = json.loads(report.read_text())
    assert r["state_matches_batch"] is True, r["mismatched_keys"]
    assert r["sink_matches_batch"] is True and r["sink_duplicate_rows"] == 0
    assert r["records"] == r["sink_rows"] == 30000
    assert r["recoveries"] >= 1 and r["master"] == cluster.master_url
    assert r["nodes"] == 2 and r["tasks_without_node"] == 0
    # the nodes' objects lie under their topology's prefix, outside the job's folder:
    # released ones holding only this job's segments are deleted, none refused or kept
    # (how many are released depends on how many checkpoints the run took: the end state
    # below shows that none is left)
    assert r["deletes_refused"] == 0 and r["shared_objects_kept"] == 0, r
    # the end state there: every written object is named by a retained checkpoint (the
    # empty files the nodes reserved ahead aside); the sweep's own cases are in
    # tests/unit/test_shared_node_objects.py
    nodes_store = ObjectStore(run_prefix(str(base)) + "/checkpoints")
    job_store = ObjectStore(checkpoint_dir(str(base)))
    named = {
        normalize(job_store, p)
        for cp in CheckpointStore(job_store).list_retained()
        for p in cp.referenced_paths()
    }
    written = [i.url for i in nodes_store.list_info(nodes_store.join("changelog")) if i.size]
    assert written and {normalize(job_store, u) for u in written} <= named
