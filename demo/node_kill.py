"""``dstl demo --kill-node-after N``: one aggregator node below the root killed hard
(SIGKILL) once N checkpoints completed, as ``--kill-task-after`` does for a task, and
the checkpoint durations before and after the kill for the report.

The node chosen is the first one below the root, breadth-first, that a task writes
to: the local tree's node of the lowest task (local mode), else the node of the
second executor in address order (the launcher's k-ary tree puts the first at the
root). Its writers move to their second node and its children to their second parent
(topology.tree, a DAG); nothing restarts it during the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstltree.aggregator.respawn import pid_alive
from dstltree.demo.chaos import kill_pid, node_pids
from dstltree.stats import percentile

#: checkpoints after the kill the report's "after" figures cover
AFTER_WINDOW = 20


@dataclass
class NodeKill:
    """The driver's progress hook (:meth:`hook`) that kills one node below the root
    once ``after_checkpoints`` checkpoints completed; ``killed``: what it killed
    (``node``, ``pid``, ``after_checkpoints``, ``at_s`` since the first hook call),
    None before. Thread-safe; the hook never raises."""

    after_checkpoints: int
    killed: dict[str, Any] | None = None
    durations_s: tuple[float, ...] = ()
    _index: int = field(default=0, init=False)
    _t0: float = field(default_factory=time.monotonic, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def hook(self, driver: Any) -> None:
        """Watch the coordinator's completed checkpoints (about every 50 ms); kill the
        node when due; keep the checkpoint durations seen so far."""
        try:
            with self._lock:
                stats = driver.coord.statistics()
                self.durations_s = tuple(stats.checkpoint_durations_s)
                if self.killed is None and stats.checkpoints_completed >= self.after_checkpoints:
                    self._kill(driver, stats.checkpoints_completed)
        except Exception:  # noqa: BLE001, S110 - the drill must never fail the job itself
            pass

    def _kill(self, driver: Any, completed: int) -> None:
        app_id = getattr(getattr(driver, "sc", None), "applicationId", None)
        found = victim(driver.nodes, app_id)
        if found is None:
            return
        node, pid = found
        kill_pid(driver.nodes, node, pid)
        self._index = len(self.durations_s)
        at_s = round(time.monotonic() - self._t0, 2)
        self.killed = {"node": node, "pid": pid, "after_checkpoints": completed, "at_s": at_s}

    def report(self) -> dict[str, Any] | None:
        """The report's ``node_kill`` entry: what was killed and the checkpoint
        durations (ms: p50, p99, max, count) before the kill and in the AFTER_WINDOW
        checkpoints after it; None when nothing was killed."""
        with self._lock:
            if self.killed is None:
                return None
            before = self.durations_s[: self._index]
            after = self.durations_s[self._index : self._index + AFTER_WINDOW]
            return {
                **self.killed,
                "checkpoint_ms_before": _summary(before),
                "checkpoint_ms_after": _summary(after),
            }


def victim(nodes: Any, app_id: str | None) -> tuple[str, int] | None:
    """(node id, PID) of the node to kill (module docstring), None when no node below
    the root is alive."""
    pids = {n: pid for n, pid in node_pids(nodes, app_id).items() if pid_alive(pid)}
    tree = getattr(nodes, "local_tree", None)
    if tree is not None:
        used = set(getattr(nodes, "node_for_task", {}).values())
        below = [n for n in tree.tree.nodes if n not in tree.tree.roots and n in pids]
        serving = [n for n in below if tree.address(n) in used]
        choice = (serving or below or [None])[0]
    else:
        executors = sorted(pids)
        choice = executors[1] if len(executors) > 1 else None
    return None if choice is None else (choice, pids[choice])


def _summary(durations_s: Sequence[float]) -> dict[str, float | int | None]:
    ms = [d * 1000 for d in durations_s]
    if not ms:
        return {"p50": None, "p99": None, "max": None, "checkpoints": 0}
    return {
        "p50": round(percentile(ms, 50), 1),
        "p99": round(percentile(ms, 99), 1),
        "max": round(max(ms), 1),
        "checkpoints": len(ms),
    }
