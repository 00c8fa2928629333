"""Work directories whose owner was SIGKILLed are found by their unheld owner lock and
deleted by the next launcher on the host; live, young or unowned ones are left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstltree.aggregator.workdirs import (
    OWNER_LOCK,
    WorkdirOwner,
    own_workdir,
    sweep_stale_workdirs,
)

_LATER = 120.0  # seconds: past the margin an unlocked lock file gets after its creation

_OWNER = """
import sys, time
from pathlib import Path
from dstltree.aggregator.workdirs import WorkdirOwner
owner = WorkdirOwner(Path(sys.argv[1]))
print("owned", flush=True)
sys.stdin.read()  # until the test kills this process
"""


def _workdir(parent: Path, name: str = "dstl-node-abc") -> Path:
    d = parent / name
    d.mkdir()
    (d / "node.key_secret").write_text("secret")
    return d


def test_a_directory_whose_owner_was_killed_is_deleted(tmp_path: Path) -> None:
    d = _workdir(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(d)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "owned"
        assert sweep_stale_workdirs(tmp_path, now=time.time() + _LATER) == []  # alive
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert sweep_stale_workdirs(tmp_path, now=time.time() + _LATER) == [d]
    assert not d.exists()


def test_an_owned_directory_stays_and_its_owner_may_delete_it(tmp_path: Path) -> None:
    d = _workdir(tmp_path, "dstl-nodes-xyz")
    owner = own_workdir(d)
    assert owner is not None and (d / OWNER_LOCK).stat().st_mode & 0o777 == 0o600
    with pytest.raises(BlockingIOError):
        WorkdirOwner(d)  # one owner at a time
    assert sweep_stale_workdirs(tmp_path, now=time.time() + _LATER) == []
    assert own_workdir(d) is None  # owned elsewhere: None, not an error
    owner.release()
    owner.release()  # idempotent
    assert sweep_stale_workdirs(tmp_path, now=time.time() + _LATER) == [d]


def test_young_unowned_and_foreign_entries_are_left_alone(tmp_path: Path) -> None:
    young = _workdir(tmp_path, "dstl-node-young")
    WorkdirOwner(young).release()  # its owner is gone, but a moment ago
    no_lock = _workdir(tmp_path, "dstl-node-nolock")  # no owner yet (or an older version)
    other = _workdir(tmp_path, "other-dir")
    WorkdirOwner(other).release()
    (tmp_path / "dstl-node-file").write_text("not a directory")
    (tmp_path / "dstl-node-link").symlink_to(other)
    assert sweep_stale_workdirs(tmp_path) == []
    later = sweep_stale_workdirs(tmp_path, now=time.time() + _LATER)
    assert later == [young]
    assert no_lock.exists() and other.exists() and (tmp_path / "dstl-node-link").is_symlink()


def test_a_missing_parent_is_no_error(tmp_path: Path) -> None:
    assert sweep_stale_workdirs(tmp_path / "absent") == []
