"""``dstl bench commit-floor`` on a scaled-down model: both turns measured, the pair
never faster than its object alone."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dstltree.bench.commit_floor import commit_floor
from dstltree.cli.app import app


def test_commit_floor_measures_both_turns(tmp_path: Path) -> None:
    figures = commit_floor("flip158-s3,scale=0.01", 8, 0.0, base=str(tmp_path))
    assert [f.hedged for f in figures] == [False, True]
    for f in figures:
        assert 0 < f.object_p50 <= f.total_p50 <= f.total_max
        assert f.total_p99 <= f.total_max
    records = list((tmp_path / "job" / "checkpoints").iterdir())
    assert len(records) == 16  # every create landed once


def test_commit_floor_cli_refuses_a_bad_spec() -> None:
    result = CliRunner().invoke(app, ["bench", "commit-floor", "--dfs-faults", "nope"])
    assert result.exit_code == 2 and "dfs-faults" in result.output
