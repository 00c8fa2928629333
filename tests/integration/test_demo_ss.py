"""``dstl demo --engine structured-streaming`` on a small input, the real command in
its own process: 20,000 flights (23 day files) landing over 10 s, an unmodified
Structured Streaming query on ``local[2]`` (RocksDB, changelog checkpointing) through a
2-node tree and the bridge, its driver killed hard after 2 committed batches and
restarted from the checkpoint. The report must say: state (read back with the
``statestore`` source) and sink equal the batch answer, no changelog file under the
checkpoint, objects in the tree, none missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.demo_run import run_demo_cli, run_prefix

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPOLOGY = """\
base_path: dstl
persist_delay: 0.02
nodes:
  - {id: root, bind: auto}
  - {id: a, bind: auto, parent: root}
"""


def _demo(tmp_path: Path, base: str, *extra: str) -> dict[str, Any]:
    """The report of the demo on 20,000 flights (module docstring), with ``extra``
    options."""
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    return run_demo_cli(
        tmp_path,
        base,
        "--engine",
        "structured-streaming",
        *extra,
        "--source-rate",
        "0",  # the quick mode's read limit is the default engine's
        "--topology",
        str(topology),
        "--master",
        "local[2]",
        "--shuffle-partitions",
        "2",
        "--kill-task-after",
        "2",
        "--limit-records",
        "20000",
        "--producer-seconds",
        "10",
    )


@pytest.mark.timeout(480)  # three driver JVMs; run_demo_cli itself gives up after 420 s
def test_structured_streaming_demo_killed_and_restarted(tmp_path: Path) -> None:
    base = str(tmp_path / "demo")
    r = _demo(tmp_path, base)
    assert r["engine"] == "structured-streaming"
    assert r["state_matches_batch"], r["mismatched_keys"]
    assert r["sink_matches_batch"], r["mismatched_keys"]
    assert r["sink_duplicate_rows"] == 0
    assert r["keys"] > 1000 and r["records"] == 20_000  # planes; flights with a distance
    assert r["killed"] is not None and r["killed"]["after_batches"] >= 2
    assert r["recoveries"] == 1
    assert r["checkpoints_completed"] >= 3  # 23 files, 8 per batch at most
    assert r["state_files"][".changelog"] == 0 and r["state_files"][".delta"] == 0
    assert r["state_files_ok"]
    assert r["objects_written"] >= 1 and r["missing"] == 0
    assert r["batch_duration_ms"]["p50"] is not None
    checkpoint = Path(run_prefix(base)) / "checkpoints" / "plane-stats"
    assert not list(checkpoint.rglob("*.changelog"))
    assert (checkpoint / "commits" / str(r["checkpoints_completed"] - 1)).exists()


@pytest.mark.timeout(480)
def test_the_demo_on_a_dstl_location_on_the_s3_model(tmp_path: Path) -> None:
    """The same with ``--checkpoint-location dstl``: every file of the location in the
    tree, the tree's objects on the FLIP-158 S3 model (latencies scaled down to keep the
    test short); no file of the checkpoint anywhere but in the tree's objects."""
    base = str(tmp_path / "demo")
    r = _demo(
        tmp_path, base, "--checkpoint-location", "dstl", "--dfs-faults", "flip158-s3,scale=0.25"
    )
    assert r["location"].startswith("dstl://") and r["dfs_faults"].startswith("flip158-s3")
    assert r["state_matches_batch"], r["mismatched_keys"]
    assert r["sink_matches_batch"], r["mismatched_keys"]
    assert r["sink_duplicate_rows"] == 0 and r["records"] == 20_000
    assert r["killed"] is not None and r["recoveries"] == 1
    assert r["checkpoints_completed"] >= 3
    assert r["plain_files"] == 0 and r["checkpoint_files"] > 0  # the view's files
    assert r["orphans"] == 0 and r["missing"] == 0 and r["objects_written"] >= 1
    assert not (Path(run_prefix(base)) / "checkpoints").exists()
