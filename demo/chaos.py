"""``dstl demo --chaos N``: N random tasks and aggregator nodes killed hard (SIGKILL)
during the main job, spread over the run, and a record of what was killed and when.

- Tasks die through the crash drill (sparkplug ``CrashDrill``, ``kill_if_drilled``): the
  driver arms attempt k of the run with the k-th drill, so each task kill takes down
  one attempt and the next one restores from the latest checkpoint. A kill is recorded
  when the driver sees the armed attempt end (``attempt`` of its coordinator moves on).
- Nodes are killed by the driver through their PIDs: the local tree's node processes
  (``NodePlacement.local_tree``, local mode) or, on ``local-cluster``, the PID files the
  executor launcher leaves on this host (``sparkplug.nodes``). Clients of a dead node
  write straight to DFS after their ack timeout; nothing restarts the node.

Everything is drawn from ``random.Random(seed)``: the same seed gives the same plan.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dstltree.aggregator.respawn import pid_alive

#: task kills fire this many checkpoints after their attempt's restored one, at least
MIN_CHECKPOINTS_BEFORE_KILL = 3


@dataclass(frozen=True)
class PlannedKill:
    """One planned kill: a ``"task"`` (``task`` index, ``after_checkpoints`` into its
    attempt) or a ``"node"`` (``at_s`` seconds after the first completed checkpoint, a node
    drawn at random among those alive then)."""

    kind: str
    task: int | None = None
    after_checkpoints: int = 0
    at_s: float = 0.0


def plan_chaos(
    kills: int, tasks: int, expected_run_s: float, seed: int, max_checkpoints: int = 12
) -> list[PlannedKill]:
    """``kills`` (>= 0) random kills of tasks (of ``tasks``) and nodes: node kills at
    times spread evenly over the first 60 % of ``expected_run_s`` seconds (so they come
    before the job ends), task kills after MIN_CHECKPOINTS_BEFORE_KILL to
    ``max_checkpoints`` checkpoints of their attempt. Raises ValueError for negative
    counts."""
    if kills < 0 or tasks < 1:
        raise ValueError(f"need kills >= 0 and tasks >= 1, got {kills}, {tasks}")
    rng = random.Random(seed)
    kinds = [rng.choice(("task", "node")) for _ in range(kills)]
    nodes = kinds.count("node")
    plan = []
    for i, kind in enumerate(kinds):
        if kind == "task":
            after = rng.randint(MIN_CHECKPOINTS_BEFORE_KILL, max(3, max_checkpoints))
            plan.append(PlannedKill("task", task=rng.randrange(tasks), after_checkpoints=after))
        else:
            k = kinds[: i + 1].count("node")
            plan.append(PlannedKill("node", at_s=round(0.6 * expected_run_s * k / (nodes + 1), 2)))
    return plan


@dataclass
class ChaosMonkey:
    """Carries out a plan during one run: :meth:`drills` are the task kills to arm (one
    per attempt, after ``first`` drills the caller arms itself), :meth:`hook` is the
    driver's progress hook that kills nodes when due and records task kills.
    ``killed``: the kills done, in order, as JSON-ready dicts (``kind``, ``at_s``
    seconds after the run's first completed checkpoint, ``task``/``attempt`` or
    ``node``/``pid``). Thread-safe."""

    plan: list[PlannedKill]
    seed: int = 0
    first: list[Any] = field(default_factory=list)
    killed: list[dict[str, Any]] = field(default_factory=list)
    _rng: random.Random = field(init=False)
    _t0: float | None = field(default=None, init=False)
    _attempt: int | None = field(default=None, init=False)
    _runs: int = field(default=0, init=False)
    _nodes_due: list[PlannedKill] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed ^ 0x5EED)
        self._nodes_due = sorted((k for k in self.plan if k.kind == "node"), key=lambda k: k.at_s)

    def drills(self) -> list[Any]:
        """The crash drills of the run, attempt by attempt: ``first`` then the plan's
        task kills (``sparkplug.CrashDrill`` s)."""
        from dstltree.sparkplug import CrashDrill

        tasks = [
            CrashDrill(k.task or 0, k.after_checkpoints) for k in self.plan if k.kind == "task"
        ]
        return [*self.first, *tasks]

    def hook(self, driver: Any) -> None:
        """The driver's progress hook (about every 50 ms): record a finished attempt
        that had a drill armed, kill the nodes that are due (times count from the
        first completed checkpoint, however long Spark took to start). Never raises."""
        try:
            with self._lock:
                now = time.monotonic()
                if self._t0 is None:
                    if driver.coord.statistics().checkpoints_completed < 1:
                        return
                    self._t0 = now
                self._see_attempt(driver, now - self._t0)
                while self._nodes_due and now - self._t0 >= self._nodes_due[0].at_s:
                    self._nodes_due.pop(0)
                    self._kill_a_node(driver, now - self._t0)
        except Exception:  # noqa: BLE001, S110 - chaos must never fail the job itself
            pass

    def _see_attempt(self, driver: Any, at_s: float) -> None:
        attempt = driver.coord.statistics().attempt
        if self._attempt is not None and attempt > self._attempt:
            drills = self.drills()
            if self._runs < len(drills):
                d = drills[self._runs]
                by = "kill-task-after" if self._runs < len(self.first) else "chaos"
                entry = {"kind": "task", "by": by, "task": d.task, "attempt": self._attempt}
                entry.update(after_checkpoints=d.after_checkpoints, at_s=round(at_s, 2))
                self.killed.append(entry)
            self._runs += 1
        self._attempt = attempt

    def _kill_a_node(self, driver: Any, at_s: float) -> None:
        app_id = getattr(getattr(driver, "sc", None), "applicationId", None)
        alive = {n: pid for n, pid in node_pids(driver.nodes, app_id).items() if pid_alive(pid)}
        if not alive:
            return
        node = self._rng.choice(sorted(alive))
        kill_pid(driver.nodes, node, alive[node])
        self.killed.append(
            {
                "kind": "node",
                "by": "chaos",
                "node": node,
                "pid": alive[node],
                "at_s": round(at_s, 2),
            }
        )

    def report(self) -> dict[str, Any]:
        """The report's ``chaos`` entry: the plan's size, the tasks and nodes it killed,
        and every kill done in the run, the crash drill's (``by``: ``kill-task-after``)
        included."""
        with self._lock:
            chaos = [k for k in self.killed if k["by"] == "chaos"]
            return {
                "planned": len(self.plan),
                "tasks_killed": sum(k["kind"] == "task" for k in chaos),
                "nodes_killed": sum(k["kind"] == "node" for k in chaos),
                "killed": list(self.killed),
            }


def node_pids(nodes: Any, app_id: str | None = None) -> dict[str, int]:
    """Node id -> PID of the job's node processes on this machine: the local tree's,
    else (with the Spark ``app_id``) those the executor launcher recorded in PID files
    on this host, by executor address."""
    tree = getattr(nodes, "local_tree", None)
    if tree is not None:
        return {n: h.pid for n, h in tree.nodes.items()}
    out: dict[str, int] = {}
    run = app_id
    if run is None:
        return out
    from dstltree.sparkplug.nodes import _pid_file

    for executor in getattr(nodes, "node_for_executor", {}):
        with contextlib.suppress(OSError, ValueError):
            out[executor] = int(_pid_file(run, executor).read_text())
    return out


def kill_pid(nodes: Any, node: str, pid: int) -> None:
    """SIGKILL node ``node`` (its process ``pid``); reaped where it is our child."""
    tree = getattr(nodes, "local_tree", None)
    if tree is not None and node in tree.nodes:
        tree.nodes[node].kill()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def compose(*hooks: Callable[[Any], None] | None) -> Callable[[Any], None] | None:
    """One progress hook calling each of ``hooks`` (None entries skipped) in order."""
    live = [h for h in hooks if h is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]

    def hook(driver: Any) -> None:
        for h in live:
            h(driver)

    return hook
