"""Restarting dead nodes: a thread beside a :class:`~dstltree.aggregator.launcher.LocalTree`
that notices a node process that exited without being asked to (SIGKILL, a crash, an
OOM kill) and starts it again with the same id, endpoint and parents
(:meth:`LocalTree.restart`), so that its children and writers reconnect to it and get
their traffic back after their hold-down. A restart that fails is tried again after a
backoff (1, 2, 4 ... at most 30 s)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dstltree.aggregator.launcher import LocalTree

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


class NodeSupervisor:
    """Polls the node processes of ``tree`` every ``interval`` seconds and restarts the
    dead ones. ``restarts``: node id -> restarts done; ``failures``: restarts that
    failed (tried again later). Thread-safe counters; :meth:`stop` before the nodes
    are stopped on purpose."""

    def __init__(self, tree: LocalTree, interval: float = 0.2) -> None:
        self.tree, self.interval = tree, interval
        self.restarts: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._retry_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-supervisor", daemon=True)

    def start(self) -> NodeSupervisor:
        self._thread.start()
        return self

    def stop(self, timeout: float = 40.0) -> None:
        """Stop watching (a restart under way finishes first, at most ``timeout`` s)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for node_id, handle in list(self.tree.nodes.items()):
                if self._stop.is_set():
                    return
                if handle.process.poll() is not None and self._due(node_id):
                    self._restart(node_id)

    def _due(self, node_id: str) -> bool:
        return time.monotonic() >= self._retry_at.get(node_id, 0.0)

    def _restart(self, node_id: str) -> None:
        code = self.tree.nodes[node_id].process.returncode
        try:
            self.tree.restart(node_id)
        except Exception as e:  # noqa: BLE001 - logged; tried again after a backoff
            self.failures[node_id] += 1
            backoff = min(MAX_BACKOFF_S, 2.0 ** (self.failures[node_id] - 1))
            self._retry_at[node_id] = time.monotonic() + backoff
            log.warning("node %s: restart failed (%s); again in %.0f s", node_id, e, backoff)
            return
        self.failures.pop(node_id, None)
        self._retry_at.pop(node_id, None)
        self.restarts[node_id] += 1
        log.warning("node %s exited (code %s): restarted", node_id, code)
