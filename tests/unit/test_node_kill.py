"""``dstl demo --kill-node-after N`` (demo/node_kill.py): the driver's hook kills one
node below the root once N checkpoints completed, and the report splits the checkpoint
durations at the kill. Real processes stand for the executors' nodes (PID files as the
executor launcher leaves them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dstltree.demo.node_kill import NodeKill
from dstltree.sparkplug.nodes import NodePlacement, _pid_file


class _Coordinator:
    def __init__(self) -> None:
        self.durations: list[float] = []

    def statistics(self) -> SimpleNamespace:
        return SimpleNamespace(
            checkpoints_completed=len(self.durations),
            checkpoint_durations_s=tuple(self.durations),
        )


@pytest.fixture
def executor_nodes(tmp_path: Path):  # type: ignore[no-untyped-def]
    run = f"app-test-{tmp_path.name}"
    executors = ["10.0.0.1:40001", "10.0.0.2:40002"]
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in executors
    ]
    for e, p in zip(executors, procs, strict=True):
        _pid_file(run, e).write_text(str(p.pid))
    yield run, executors, procs
    for e, p in zip(executors, procs, strict=True):
        p.kill()
        p.wait(timeout=10)
        _pid_file(run, e).unlink(missing_ok=True)


def test_the_node_of_the_second_executor_dies_after_n_checkpoints(executor_nodes) -> None:  # type: ignore[no-untyped-def]
    run, executors, (root, below) = executor_nodes
    nodes = NodePlacement(node_for_executor={e: f"tcp://{e}" for e in executors})
    coord = _Coordinator()
    driver = SimpleNamespace(coord=coord, nodes=nodes, sc=SimpleNamespace(applicationId=run))
    kill = NodeKill(after_checkpoints=3)
    for d in (0.05, 0.06, 0.04):
        kill.hook(driver)
        assert kill.killed is None and below.poll() is None, "not before 3 checkpoints"
        coord.durations.append(d)
    kill.hook(driver)
    assert kill.killed is not None and kill.killed["node"] == executors[1]
    assert below.wait(timeout=10) == -9 and root.poll() is None, "SIGKILL, the root spared"
    coord.durations += [0.3, 0.1, 0.05]
    kill.hook(driver)
    report = kill.report()
    assert report is not None and report["after_checkpoints"] == 3
    assert report["checkpoint_ms_before"]["checkpoints"] == 3
    assert report["checkpoint_ms_before"]["max"] == 60.0
    assert report["checkpoint_ms_after"] == {
        "p50": 100.0,
        "p99": pytest.approx(296.0, abs=1.0),
        "max": 300.0,
        "checkpoints": 3,
    }
    kill.hook(driver)  # once only
    assert kill.report()["pid"] == below.pid  # type: ignore[index]


def test_nothing_to_kill_reports_nothing() -> None:
    driver = SimpleNamespace(coord=_Coordinator(), nodes=NodePlacement(), sc=None)
    kill = NodeKill(after_checkpoints=0)
    kill.hook(driver)
    assert kill.killed is None and kill.report() is None
