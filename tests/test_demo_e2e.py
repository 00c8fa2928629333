"""The main job end to end, in a quick mode with a task killed hard: once in local mode
(the nodes of deploy/local.yaml) and once on local-cluster[2,1,1024] with one node per
executor. Runs the real ``dstl demo`` command in a subprocess (its own JVM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def _demo(tmp_path: Path, *args: str) -> dict:
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "sparkplug.cli", "demo", "--base-path", str(tmp_path / "dfs"),
           "--report", str(report), "--limit-records", "30000", "--records-per-second", "10000",
           "--kill-task-after", "4", "--materialization-interval", "1.0", *args]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=420, env=os.environ
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(report.read_text())


def _check(r: dict, nodes: int) -> None:
    assert r["state_matches_batch"] is True, r["mismatched_keys"]
    assert r["mismatched_keys"] == []
    assert r["recoveries"] == 1
    assert r["checkpoints_completed"] >= 5
    assert r["materializations"] >= 1
    assert r["nodes"] == nodes
    assert r["records"] == 30000
    assert r["objects_written"] >= 1 and r["changelog_bytes"] > 0
    assert r["checkpoint_duration_ms"]["p50"] is not None


def test_demo_local_mode_with_task_kill(tmp_path: Path) -> None:
    r = _demo(tmp_path, "--tasks", "4", "--master", "local[4]", "--metrics-port", "0")
    _check(r, nodes=7)
    assert r["metrics"]["coordinator"].startswith("http://127.0.0.1:")
    assert len(r["metrics"]["nodes"]) == 7 and all(r["metrics"]["nodes"].values())
    assert r["writers"] == 8  # 4 tasks x 2 attempts
    # changes of a checkpoint stay far below target_object_bytes: about one object each
    assert r["objects_per_checkpoint"] <= 1.5


def test_demo_local_cluster_one_node_per_executor(tmp_path: Path) -> None:
    r = _demo(tmp_path, "--tasks", "2", "--master", "local-cluster[2,1,1024]")
    _check(r, nodes=2)
