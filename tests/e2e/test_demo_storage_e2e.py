"""The main job on a real S3 protocol endpoint (moto on loopback) and under injected DFS
faults (throttling and stalls): the state still matches the batch result, every
retained checkpoint is fully readable, no referenced object is missing, and orphans
left by a crash are deleted on the next start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstltree.cli.commands.inspect import inspect_base
from dstltree.client import ObjectStore
from dstltree.coordinator.service import Coordinator
from dstltree.coordinator.store import CheckpointStore
from dstltree.sparkplug.restore import restore_all
from tests.support.demo_run import checkpoint_dir, run_demo_cli

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TASKS = 4


def _demo(tmp_path: Path, base: str, opts: dict, *args: str) -> dict:  # type: ignore[type-arg]
    return run_demo_cli(
        tmp_path, base, "--storage-options", json.dumps(opts), "--tasks", str(TASKS), *args
    )


def _every_retained_checkpoint_readable(base: str, opts: dict) -> int:  # type: ignore[type-arg]
    store = ObjectStore(base, opts)
    retained = CheckpointStore(store).list_retained()
    for cp in retained:
        restore_all(store, cp, 128)  # raises if an object is missing or corrupt
    return len(retained)


def test_demo_recovery_and_cleanup_on_local_s3(tmp_path: Path, s3) -> None:  # type: ignore[no-untyped-def]
    root, opts = s3.base_url + "/demo", s3.storage_options
    r = _demo(tmp_path, root, opts)
    base = checkpoint_dir(root)
    assert r["state_matches_batch"] is True and r["recoveries"] == 1
    assert r["sink_duplicate_rows"] == 0 and r["sink_matches_batch"] is True
    assert r["base_path"].startswith("s3://")
    summary = inspect_base(base, opts)
    assert summary["missing"] == [] and summary["orphans"] == []
    assert set(summary["referenced"]) <= set(summary["present"])
    assert _every_retained_checkpoint_readable(base, opts) >= 1
    # a crash leaves an unreferenced object behind: the next start deletes it (here with
    # no grace period, so that the object just written counts as old)
    store = ObjectStore(base, opts)
    orphan = store.new_object_path()
    store.put(orphan, b"left by a crashed writer node")
    with Coordinator(store, TASKS, orphan_grace=0.0) as coord:
        assert coord.statistics().orphans_deleted >= 1
    assert not store.exists(orphan)
    assert inspect_base(base, opts)["missing"] == []


def test_demo_under_throttling_and_stalls(tmp_path: Path) -> None:
    base = str(tmp_path / "dfs")
    spec = "flip158-s3,scale=0.05,throttle=0.05,stall=0.02,stall_s=20,seed=7"
    r = _demo(tmp_path, base, {}, "--dfs-faults", spec)
    base = checkpoint_dir(base)
    assert r["state_matches_batch"] is True, r["mismatched_keys"]
    assert r["recoveries"] == 1 and r["checkpoints_completed"] >= 3
    summary = inspect_base(base, {})
    assert summary["missing"] == [], "no referenced object is missing"
    assert _every_retained_checkpoint_readable(base, {}) >= 1
