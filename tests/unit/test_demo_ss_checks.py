"""The pure figures of ``dstl demo --engine structured-streaming``
(dstltree.demo.ss_checks): progress events, the checkpoint directory, the tree against
the bridge's manifest, the verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dstltree.demo.checks import BatchStats, SinkSummary
from dstltree.demo.ss_checks import (
    checkpoint_figures,
    progress_figures,
    read_progress,
    tree_figures,
    verdicts,
)


def _event(run: str, batch: int, at_ms: int, took_ms: int, trigger: str = "interval") -> dict:
    seconds, ms = divmod(at_ms, 1000)
    return {
        "runId": run,
        "batchId": batch,
        "timestamp": f"2026-01-01T00:00:{seconds:02d}.{ms:03d}Z",
        "durationMs": {"triggerExecution": took_ms, "addBatch": took_ms - 10},
        "numInputRows": 5,
        "trigger": trigger,
    }


def test_progress_figures_per_run_intervals_only_with_the_trigger(tmp_path: Path) -> None:
    first = [_event("a", 0, 0, 100), _event("a", 1, 300, 200)]
    second = [_event("b", 1, 5000, 100), _event("b", 2, 5400, 100)]
    second.append(_event("c", 3, 9000, 300, trigger="availableNow"))
    paths = [tmp_path / "p0.jsonl", tmp_path / "p1.jsonl"]
    paths[0].write_text("".join(json.dumps(e) + "\n" for e in first) + '{"cut sho')
    paths[1].write_text("".join(json.dumps(e) + "\n" for e in second))
    runs = read_progress([*paths, tmp_path / "absent.jsonl"])
    assert [len(r) for r in runs] == [2, 3, 0]
    f = progress_figures(runs)
    assert f["batches_run"] == 5 and f["input_rows"] == 25
    assert f["batch_duration_ms"]["p50"] == 100.0
    # 300 ms within run a, 400 ms within run b; none across runs or for availableNow
    assert f["batch_interval_ms"] == {"p50": 350.0, "p99": 399.0}
    assert progress_figures([])["batch_duration_ms"] == {"p50": None, "p99": None}


def test_checkpoint_figures_count_batches_files_and_state_files(tmp_path: Path) -> None:
    for d, names in {
        "commits": ["0", "1", "2", ".2.crc"],
        "offsets": ["0", "1", "2", "3"],
        "state/0/0": ["3.zip", "000008.sst"],
    }.items():
        (tmp_path / d).mkdir(parents=True)
        for n in names:
            (tmp_path / d / n).write_text("x")
    f = checkpoint_figures(tmp_path)
    assert f["batches_completed"] == 3
    assert f["checkpoint_files"] == 10 and f["checkpoint_files_per_batch"] == 3.33
    assert f["state_files"][".zip"] == 1 and f["state_files"][".sst"] == 1
    assert f["state_files_ok"]
    (tmp_path / "state" / "0" / "0" / "4.changelog").write_text("x")
    assert not checkpoint_figures(tmp_path)["state_files_ok"]


def _manifest(root: str, seq: int, files: dict[str, Any]) -> dict[str, Any]:
    return {"format": 1, "root": root, "seq": seq, "files": files}


def _file(obj: Path, deleted: bool = False, older: list[str] | None = None) -> dict:
    seg = {"path": str(obj), "offset": 0, "length": 1, "sqn": [1, 2], "crc32": 0}
    return {"sqn": 1, "length": 1, "deleted": deleted, "segment": seg, "older": older or []}


def test_tree_figures_orphans_and_missing_as_inspect_sees_them(tmp_path: Path) -> None:
    tree, checkpoint = tmp_path / "tree", tmp_path / "ckpt"
    objects = tree / "changelog" / "x"
    objects.mkdir(parents=True)
    live, older, orphan, other = (objects / f"{n}.dstl" for n in ("l", "o", "x", "q"))
    for o in (live, older, orphan, other):
        o.write_bytes(b"o")
    gone = objects / "gone.dstl"
    root = f"file:{checkpoint}"
    manifests = {
        "k/manifest-1.json": _manifest(root, 1, {"state/0/0/1.changelog": _file(orphan)}),
        "k/manifest-2.json": _manifest(
            root,
            2,
            {
                "state/0/0/2.changelog": _file(live, older=[str(older)]),
                "state/0/1/2.changelog": _file(gone),
            },
        ),
        "j/manifest-7.json": _manifest("file:/elsewhere", 7, {"s/0/0/1.delta": _file(other)}),
    }
    for name, doc in manifests.items():
        (tree / "ss" / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / "ss" / name).write_text(json.dumps(doc))
    f = tree_figures(str(tree), batches=4)
    assert f["objects_written"] == 4 and f["objects_per_batch"] == 1.0
    assert (f["orphans"], f["orphan_paths"]) == (1, [str(orphan)])  # only an old manifest's
    assert f["missing"] == 1
    assert sorted(f["ss_queries"]) == sorted([root, "file:/elsewhere"])
    # newest seqs 2 and 7 (seq counts from 0): 3 + 8 manifests written
    assert (f["manifests_written"], f["manifests_per_batch"]) == (11, 2.75)


def test_verdicts_state_sink_duplicates() -> None:
    stats = {"N1": [2, 1, 2, 300, 10, "JFK", "LAX"], None: [1, 0, 0, 50, 5, "EWR", "BOS"]}
    batch = BatchStats(stats, {}, 3)
    sink = SinkSummary(rows=3, duplicate_rows=0, latest=dict(stats))
    v = verdicts(batch, sink, dict(stats))
    assert v["state_matches_batch"] and v["sink_matches_batch"] and v["keys"] == 2
    bad_state = {**stats, "N1": [2, 1, 2, 301, 10, "JFK", "LAX"]}
    v = verdicts(batch, SinkSummary(3, 1, dict(stats)), bad_state)
    assert not v["state_matches_batch"] and not v["sink_matches_batch"]
    assert v["mismatched_keys"] == ["N1"]
