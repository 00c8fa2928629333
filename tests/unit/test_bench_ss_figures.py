"""The pure parts of ``dstl bench structured-streaming``: figures from query progress,
the latency settings rendered from ``topology.latency``, settings checks, table rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dstltree.bench.ss_query import QueryInput, _figures, checkpoint_files
from dstltree.bench.structured_streaming import SsBenchSettings, SsRun, latency_conf, tree_requests
from dstltree.cli.commands._structured_streaming import COLUMNS, table_rows
from dstltree.topology.latency import get_model


def _progress(batch: int, start_ms: int, duration_ms: int, rows: int = 10) -> dict:
    seconds, ms = divmod(start_ms, 1000)
    return {
        "batchId": batch,
        "timestamp": f"2026-01-01T00:00:{seconds:02d}.{ms:03d}Z",
        "durationMs": {"triggerExecution": duration_ms},
        "numInputRows": rows,
    }


def test_figures_from_progress_and_files(tmp_path: Path) -> None:
    (tmp_path / "state" / "0" / "1").mkdir(parents=True)
    (tmp_path / "state" / "0" / "1" / "1.changelog").write_bytes(b"x" * 10)
    (tmp_path / "state" / "0" / "1" / ".1.changelog.crc").write_bytes(b"c")
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_bytes(b"y" * 5)
    spec = QueryInput(files=4, rows=10, keys=3, trigger_s=0.3)
    # starts 0, 0.3, 0.9 (late: 0.6 s > 1.5 x 0.3), 1.2; each 100 ms, the last 300 ms
    progress = [_progress(0, 0, 100), _progress(1, 300, 100), _progress(2, 900, 100)]
    progress.append(_progress(3, 1200, 300))
    f = _figures(progress, spec, 1.5, tmp_path)
    assert (f.batches, f.rows) == (4, 40)
    assert f.batch_p50_s == pytest.approx(0.1) and f.batch_max_s == pytest.approx(0.3)
    assert f.held == pytest.approx(2 / 3)
    assert f.records_per_s == pytest.approx(40 / 1.5)
    assert (f.checkpoint_files, f.checkpoint_bytes, f.changelog_files) == (2, 15, 1)
    assert checkpoint_files(tmp_path / "missing") == (0, 0, 0)


def test_latency_conf_renders_the_model() -> None:
    conf = latency_conf("flip158-s3", scale=0.5, seed=7)
    model = get_model("flip158-s3").scaled(0.5)
    table = conf["spark.hadoop.dstltree.latency.percentiles"]
    pairs = dict(tuple(map(float, item.split(":"))) for item in table.split(","))
    assert pairs == dict(model.percentiles)
    assert float(conf["spark.hadoop.dstltree.latency.bandwidth"]) == model.bandwidth
    assert float(conf["spark.hadoop.dstltree.latency.floor"]) == model.floor_s
    assert conf["spark.hadoop.dstltree.latency.seed"] == "7"
    assert conf["spark.hadoop.fs.latency.impl"] == "io.dstltree.spark.LatencyFileSystem"
    with pytest.raises(ValueError, match="unknown latency model"):
        latency_conf("nope")


def test_settings_checks_and_fault_spec() -> None:
    assert SsBenchSettings().fault_spec is None
    s = SsBenchSettings(dfs_model="flip158-s3", scale=0.1, seed=3)
    assert s.fault_spec == "flip158-s3,scale=0.1,seed=3"
    bads = ({"dfs_model": "nope"}, {"partitions": ()}, {"batches": 0}, {"trigger_s": 0})
    for bad in (*bads, {"hosts": -1}, {"hosts": 9}):
        with pytest.raises(ValueError):
            SsBenchSettings(**bad)  # type: ignore[arg-type]


def test_table_rows_one_per_run(tmp_path: Path) -> None:
    spec = QueryInput(files=2, rows=10, keys=3, trigger_s=0.3)
    f = _figures([_progress(0, 0, 100), _progress(1, 300, 100)], spec, 1.5, tmp_path)
    runs = [SsRun("spark", 4, f, 0, {}), SsRun("tree", 4, f, 3, {})]
    rows = table_rows(runs)
    assert [len(r) for r in rows] == [len(COLUMNS)] * 2
    objects, written = COLUMNS.index("tree objects"), COLUMNS.index("written/batch")
    assert rows[0][objects] == "-" and rows[1][objects] == "1.50 (3)"
    files = f.checkpoint_files
    assert rows[0][written] == f"{files / 2:.1f}" and rows[1][written] == f"{(files + 3) / 2:.1f}"
    assert rows[0][COLUMNS.index("trigger held")] == "yes 100%"
    single = _figures([_progress(0, 0, 100)], spec, 1.5, tmp_path)
    assert math.isnan(single.held)
    assert table_rows([SsRun("tree", 4, single, 1, {})])[0][COLUMNS.index("trigger held")] == "-"


def test_warmup_batches_leave_durations_and_intervals(tmp_path: Path) -> None:
    spec = QueryInput(files=3, rows=10, keys=3, trigger_s=0.3)
    progress = [_progress(0, 0, 5000), _progress(1, 5000, 100), _progress(2, 5300, 100)]
    f = _figures(progress, spec, 1.5, tmp_path, warmup=1)
    assert f.batch_max_s == pytest.approx(0.1) and f.held == 1.0
    assert f.batches == 3 and f.records_per_s == pytest.approx(30 / 5.4)
    assert _figures(progress[:1], spec, 1.5, tmp_path, warmup=1).batch_max_s == 5.0


def test_tree_requests_are_counted_from_the_log_run_by_run(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    assert tree_requests(log, 0) == ({}, 0)
    log.write_bytes(b"put\ta\nhead\tb\nput\tc\n")
    first, end = tree_requests(log, 0)
    assert first == {"put": 2, "head": 1} and end == log.stat().st_size
    with open(log, "ab") as f:
        f.write(b"list\td\nget\te\nput\tf")  # the last line still being appended
    second, end2 = tree_requests(log, end)
    assert second == {"list": 1, "get": 1} and end2 == log.stat().st_size - len(b"put\tf")
    spec = QueryInput(files=2, rows=10, keys=3, trigger_s=0.3)
    f = _figures([_progress(0, 0, 100), _progress(1, 300, 100)], spec, 1.5, tmp_path)
    run = SsRun("tree", 4, f, 1, {"put": 2, "rename": 2}, tree_requests=first)
    assert run.requests_per_batch == {"put": 2.0, "rename": 1.0, "head": 0.5}
    assert run.to_dict()["tree_requests"] == first
