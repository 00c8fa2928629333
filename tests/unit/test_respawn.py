"""The respawner's loop (aggregator/respawn.py) on real child processes: a node that
keeps dying at its start is given up after ``max_quick_deaths`` deaths in a row; a stop
on purpose ends the loop at once."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from dstltree.aggregator.respawn import _supervise


def _dies_at_start(marks: Path, code: int) -> list[str]:
    """A command that leaves one line in ``marks`` and exits with ``code``."""
    script = f"open({str(marks)!r}, 'a').write('started\\n'); raise SystemExit({code})"
    return [sys.executable, "-c", script]


def test_a_node_dying_at_every_start_is_given_up(tmp_path: Path) -> None:
    marks, pid_file = tmp_path / "starts", tmp_path / "node.pid"
    running: dict[str, subprocess.Popen[bytes]] = {}
    cmd = _dies_at_start(marks, 3)
    code = _supervise(cmd, pid_file, None, threading.Event(), running, max_quick_deaths=3)
    assert code == 3
    assert marks.read_text().splitlines() == ["started"] * 3, "three starts, then no more"
    assert running["node"].poll() == 3


def test_a_stop_on_purpose_is_no_death(tmp_path: Path) -> None:
    marks, pid_file = tmp_path / "starts", tmp_path / "node.pid"
    stop = threading.Event()
    stop.set()  # as the signal handler does: the node's end is not a death
    running: dict[str, subprocess.Popen[bytes]] = {}
    code = _supervise(_dies_at_start(marks, 1), pid_file, None, stop, running)
    assert code == 1 and marks.read_text().splitlines() == ["started"]
