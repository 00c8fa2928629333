"""The materialization benchmark's pieces that need no Spark (bench/materialization.py):
the incremental case on the real backend and materializer, the inputs, the markdown
section, the command's registration. The Spark cases run in `dstl bench
materialization`; the same job paths are covered by tests/e2e/test_streaming_jobs.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import typer
from typer.testing import CliRunner

from dstltree.bench.materialization import (
    incremental_case,
    markdown_section,
    write_input,
    write_updates,
)
from dstltree.cli.commands import bench


def test_one_percent_changed_writes_about_one_percent() -> None:
    r = incremental_case(20_000, 0.01, seed=3)
    assert r["first_written_bytes"] == r["state_bytes"] > 20_000 * 40
    assert 0 < r["second_written_ratio"] <= 0.05
    assert r["longest_step_ms"] > 0 and r["files"] >= 1


def test_inputs_hold_every_key_then_updates(tmp_path: Path) -> None:
    n = write_input(tmp_path, 100, 50, seed=1, files=2, name="load", complete=False)
    assert n == 150 and not (tmp_path / "_SUCCESS").exists()
    assert write_updates(tmp_path, 100, 30, seed=1, files=1) == 30
    rows = pq.read_table(tmp_path).to_pylist()
    assert len(rows) == 180 and {f"k{k}" for k in range(100)} <= {r["key"] for r in rows}
    assert all(len(r["payload"]) == 32 for r in rows) and (tmp_path / "_SUCCESS").exists()


def test_the_markdown_section_quotes_every_case() -> None:
    case = {
        "max_gap_ms": 50.0,
        "checkpoint_p50_ms": 20.0,
        "checkpoint_p99_ms": 40.0,
        "checkpoint_sync_p99_ms": 1.0,
        "checkpoint_async_p99_ms": 30.0,
        "materialization_sync_max_ms": 2.0,
        "materialization_mean_s": 0.3,
        "state_bytes": 1000,
        "written_bytes_mean": 100,
        "written_bytes_max": 1000,
        "materializations": 3,
        "checkpoints": 30,
    }
    doc = {
        "settings": {
            "updates": 10,
            "steady_rate": 5.0,
            "checkpoint_interval": 0.3,
            "materialization_interval": 3.0,
        },
        "keys": {"small": case, "large": case, "p99_ratio": 1.0},
        "incremental": incremental_case(2_000, 0.01, seed=1),
        "throughput": {
            "checkpoints_on": {"records_per_second": 90.0},
            "checkpoints_off": {"records_per_second": 100.0},
            "ratio": 0.9,
        },
        "kill": {
            "calm": {"orphans": 0},
            "killed": {"orphans": 0, "recoveries": 1, "materializations": 4},
            "same_state": True,
            "same_sink_rows": True,
        },
    }
    text = markdown_section(
        doc, {"command": "dstl bench materialization", "commit": "c", "date": "d"}
    )
    assert text.startswith("## Materialization\n")
    assert "| longest gap between two batches processed | 50.0 ms | 50.0 ms | <= 100 ms |" in text
    assert "0.9x (target >= 0.8x)" in text and "orphans after the run: 0 (calm), 0 (killed)" in text


def test_the_command_is_registered() -> None:
    app = typer.Typer()
    bench.register(app)
    r = CliRunner().invoke(app, ["bench", "materialization", "--help"])
    assert r.exit_code == 0 and "--large-keys" in r.output
