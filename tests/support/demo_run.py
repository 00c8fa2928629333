"""Running the real ``dstl demo`` command in a subprocess (its own JVM), in the quick
mode of the end-to-end tests: 30,000 flights landing over 15 s and read at most 1,000
records/s per task (so that the job spans many checkpoints however long Spark takes to
start), one task killed hard after 4 checkpoints, a materialization every second, the
run's files under ``<base>/e2e/`` (a fixed run id)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "e2e"
QUICK = [
    "--run-id",
    RUN_ID,
    "--limit-records",
    "30000",
    "--producer-seconds",
    "15",
    "--source-rate",
    "1000",
    "--kill-task-after",
    "4",
    "--materialization-interval",
    "1.0",
]


def run_demo_cli(
    tmp_path: Path, base: str, *args: str, tmpdir: Path | None = None
) -> dict[str, Any]:
    """The report of ``dstl demo --base-path base`` plus the quick mode and ``args``
    (later flags win); fails the test with the command's stderr if it exits non-zero.
    ``tmpdir``: the command's ``$TMPDIR`` (its Python workers' temporary files)."""
    report = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "dstltree.cli.app",
        "demo",
        "--base-path",
        base,
        "--report",
        str(report),
        *QUICK,
        *args,
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
        env=os.environ if tmpdir is None else {**os.environ, "TMPDIR": str(tmpdir)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def run_prefix(base: str) -> str:
    """The quick mode's run folder below the demo's base path ``base``."""
    return base.rstrip("/") + "/" + RUN_ID


def checkpoint_dir(base: str) -> str:
    """The demo job's checkpoint directory below the demo's base path ``base``."""
    return run_prefix(base) + "/checkpoints/plane-stats"
