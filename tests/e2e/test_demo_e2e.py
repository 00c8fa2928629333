"""The main job end to end, in a quick mode with a task killed hard: once in local mode
(the nodes of deploy/local.yaml) with ``--chaos 2`` on top (seed 24: node a1, the node
of task 3, killed with SIGKILL 4.5 s after the first checkpoint, and task 1 killed in
the second attempt), and once on local-cluster[2,1,1024] with one node per
executor whose second node is killed (``--kill-node-after 5``), with unaligned
checkpoints (``--checkpointing unaligned``). Runs the real
``dstl demo`` command in a subprocess (its own JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.demo.producer import flights_table
from tests.support.demo_run import run_demo_cli

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _demo(tmp_path: Path, *args: str) -> dict:
    return run_demo_cli(tmp_path, str(tmp_path / "dfs"), *args)


def _check(r: dict, nodes: int, recoveries: int = 1) -> None:
    assert r["state_matches_batch"] is True, r["mismatched_keys"]
    assert r["sink_matches_batch"] is True and r["sink_duplicate_rows"] == 0
    assert r["mismatched_keys"] == []
    assert r["recoveries"] == recoveries
    assert r["run_prefix"].endswith("/dfs/e2e")
    assert r["checkpoints_completed"] >= 5
    assert r["materializations"] >= 1
    assert r["nodes"] == nodes
    assert r["records"] == r["sink_rows"] == 30000
    # one aggregate per plane, flights without a tail number under the null key
    assert r["keys"] == len(set(flights_table(30000).column("tailnum").to_pylist()))
    assert r["objects_written"] >= r["objects_referenced"] >= 1
    # every event changes its plane's value: at least one encoded change per record
    assert r["changelog_bytes"] >= r["records"]
    p50, p99 = r["checkpoint_duration_ms"]["p50"], r["checkpoint_duration_ms"]["p99"]
    assert 0 < p50 <= p99


@pytest.mark.timeout(420)  # the demo subprocess's own limit: one more attempt than the others
def test_demo_local_mode_with_task_kill_and_chaos(tmp_path: Path) -> None:
    # read at 400 records/s per task: 19 s of reading leave room for both task kills
    chaos = ("--chaos", "2", "--chaos-seed", "24", "--source-rate", "400")
    r = _demo(tmp_path, "--tasks", "4", "--master", "local[4]", "--metrics-port", "0", *chaos)
    c = r["chaos"]
    assert c["planned"] == 2 and c["tasks_killed"] == 1 and c["nodes_killed"] == 1, c
    killed = [(k["by"], k["kind"], k.get("task", k.get("node"))) for k in c["killed"]]
    assert sorted(killed) == [
        ("chaos", "node", "a1"),
        ("chaos", "task", 1),
        ("kill-task-after", "task", 3),
    ], c
    _check(r, nodes=7, recoveries=2)  # the crash drill, then the chaos task kill
    assert r["metrics"]["coordinator"].startswith("http://127.0.0.1:")
    assert len(r["metrics"]["nodes"]) == 7 and all(r["metrics"]["nodes"].values())
    assert r["writers"] == 12  # 4 tasks x 3 attempts
    assert r["missing"] == 0
    assert r["orphans"] == 0, r["orphan_paths"]
    # changes of a checkpoint stay far below target_object_bytes: about one object each,
    # plus the direct writes of the tasks whose node was killed
    assert r["objects_per_checkpoint"] <= 3


def test_demo_local_cluster_one_node_per_executor(tmp_path: Path) -> None:
    # the second executor's node killed hard after 5 checkpoints: its task goes on
    # through the first executor's node (its second node), the result stays exact;
    # checkpoints unaligned (FLIP-76), the task kill recovered from one of them
    tmp = tmp_path / "tmp"  # the executors' temporary directory: the nodes' work dirs
    tmp.mkdir()
    args = ("--tasks", "2", "--master", "local-cluster[2,1,1024]", "--kill-node-after", "5")
    unaligned = ("--checkpointing", "unaligned")
    r = run_demo_cli(tmp_path, str(tmp_path / "dfs"), *args, *unaligned, tmpdir=tmp)
    _check(r, nodes=2)
    assert r["checkpointing"] == "unaligned"
    assert r["checkpoints_unaligned"] >= 5  # every checkpoint but a run's final one
    # each node's directory (topology, CURVE key files, statistics) and PID file went
    # with the node: nothing of them outlives the job on the executors' hosts
    assert sorted(p.name for p in tmp.glob("dstl-node*")) == []
    k = r["node_kill"]
    assert k is not None and k["after_checkpoints"] >= 5, r
    assert k["checkpoint_ms_before"]["checkpoints"] >= 5
    assert k["checkpoint_ms_after"]["checkpoints"] >= 1
    assert r["missing"] == 0 and r["orphans"] == 0, r["orphan_paths"]


def test_demo_rescaled_from_4_to_2_tasks(tmp_path: Path) -> None:
    # the first run stops 12 s after its first checkpoint (Spark's start-up, however
    # long on a busy machine, not counted): its crash drill (after 4 checkpoints, about
    # 1.2 s) has fired by then; read at 400 records/s per task for about 19 s it is still
    # reading, so its state moves from 4 tasks to 2 in the middle of the input
    args = ("--rescale-to", "2", "--rescale-after", "12", "--source-rate", "400")
    r = _demo(tmp_path, "--tasks", "4", *args)
    assert r["rescaled_from"] == 4 and r["tasks"] == 2
    _check(r, nodes=7)
