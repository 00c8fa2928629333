"""``dstl demo --chaos N`` without Spark: the plan is seeded and spread over the run,
task kills become one crash drill per attempt, the driver's hook kills due nodes by
PID (a real process here) and records every kill."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dstltree.aggregator.launcher import NodeHandle
from dstltree.demo.chaos import ChaosMonkey, PlannedKill, compose, node_pids, plan_chaos
from dstltree.demo.job import DemoOptions, make_monkey
from dstltree.sparkplug import CrashDrill
from dstltree.sparkplug.job import _drill_of


def test_plans_are_seeded_and_spread_over_the_run() -> None:
    plan = plan_chaos(12, tasks=4, expected_run_s=100.0, seed=3)
    assert plan == plan_chaos(12, tasks=4, expected_run_s=100.0, seed=3)
    assert len(plan) == 12 and {k.kind for k in plan} == {"task", "node"}
    nodes = [k.at_s for k in plan if k.kind == "node"]
    assert nodes == sorted(nodes) and nodes[0] > 0 and nodes[-1] < 60.0
    assert all(0 <= k.task < 4 and 3 <= k.after_checkpoints <= 12 for k in plan if k.kind == "task")
    assert plan_chaos(0, 4, 10.0, 1) == []
    with pytest.raises(ValueError):
        plan_chaos(-1, 4, 10.0, 1)


def test_task_kills_are_one_drill_per_attempt() -> None:
    first = CrashDrill(3, 4)
    plan = [PlannedKill("task", task=1, after_checkpoints=5), PlannedKill("node", at_s=1.0)]
    drills = ChaosMonkey(plan, first=[first]).drills()
    assert drills == [first, CrashDrill(1, 5)]
    assert [_drill_of(tuple(drills), n) for n in range(3)] == [first, CrashDrill(1, 5), None]
    assert _drill_of(first, 0) == first and _drill_of(first, 1) is None
    assert _drill_of(None, 0) is None


def test_monkey_from_options() -> None:
    assert make_monkey(DemoOptions(base_path="x"), 1000) is None
    monkey = make_monkey(DemoOptions(base_path="x", chaos=3, chaos_seed=5), 30000)
    assert monkey is not None and len(monkey.plan) == 3


def _driver(attempt: list[int], handle: NodeHandle) -> Any:
    stats = SimpleNamespace(
        statistics=lambda: SimpleNamespace(attempt=attempt[0], checkpoints_completed=1)
    )
    tree = SimpleNamespace(nodes={handle.node_id: handle})
    return SimpleNamespace(coord=stats, nodes=SimpleNamespace(local_tree=tree))


def test_hook_kills_due_nodes_by_pid_and_records_task_kills(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        handle = NodeHandle("a1", 2, "tcp://127.0.0.1:1", proc)  # type: ignore[arg-type]
        plan = [PlannedKill("node", at_s=0.0), PlannedKill("task", task=2, after_checkpoints=3)]
        monkey = ChaosMonkey(plan, seed=1)
        attempt = [0]
        driver = _driver(attempt, handle)
        hook = compose(None, monkey.hook)
        assert hook is not None
        hook(driver)  # the node kill is due at once
        assert proc.wait(timeout=10) == -9
        attempt[0] = 1  # the drilled attempt ended
        hook(driver)
        hook(SimpleNamespace())  # a driver without those attributes: nothing, no error
        r = monkey.report()
        assert r["planned"] == 2 and r["nodes_killed"] == 1 and r["tasks_killed"] == 1
        node, task = r["killed"]
        assert node["node"] == "a1" and node["pid"] == proc.pid and node["at_s"] >= 0
        assert task == {**task, "kind": "task", "by": "chaos", "task": 2, "attempt": 0}
        assert node_pids(driver.nodes) == {"a1": proc.pid}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_nothing_happens_before_the_first_checkpoint_and_drills_are_told_apart() -> None:
    first = CrashDrill(3, 4)
    monkey = ChaosMonkey([PlannedKill("node", at_s=0.0)], first=[first])
    state = {"attempt": 0, "checkpoints_completed": 0}
    tree = SimpleNamespace(nodes={})
    driver = SimpleNamespace(
        coord=SimpleNamespace(statistics=lambda: SimpleNamespace(**state)),
        nodes=SimpleNamespace(local_tree=tree),
    )
    monkey.hook(driver)
    assert monkey.report()["killed"] == [] and monkey._t0 is None  # Spark still starting
    state.update(checkpoints_completed=1)
    monkey.hook(driver)  # the node kill is due, but no node is alive: nothing killed
    state.update(attempt=1)
    monkey.hook(driver)
    r = monkey.report()
    assert r["tasks_killed"] == r["nodes_killed"] == 0
    assert [(k["by"], k["task"]) for k in r["killed"]] == [("kill-task-after", 3)]
