"""Node failures in the simulator: nodes of a :class:`NodeCoreCluster` die and come back.

What is modelled (the rules are the real code's; this module only decides when):

* **The schedule.** :func:`failure_schedule`: each node, the root included, dies as a
  Poisson process of ``node_failures_per_hour`` per node-hour from ``startup_s``; it is
  back ``restart_s`` later (a dead node does not die again before). Deterministic for
  ``cfg.seed``, drawn from a generator of its own (the workload's bytes do not change).
* **A death.** Everything the node held is gone at once: its batch, the items it sent
  up and awaits acks for, the objects it was writing (counted as ``abandoned_writes``:
  the real object is a reservation or a partial file the registry's sweep removes), the
  messages in its queue and those that reach it while it is dead. What it had sent
  before still arrives.
* **Detection** ``failure_detection_s`` after the death (the real links' three missed
  ZeroMQ heartbeats): every live node that may send to it (its descendants in the DAG,
  through parents or plans) gets the node core's own ``UpstreamLost`` event, so it
  re-homes to its next configured parent (a DAG's second parent), else its next live
  ancestor, and sends its unacknowledged items on now. Each executor client whose
  node died moves by the client's own rule
  (:class:`dstltree.client.failover.NodePreference`) to its neighbour's node,
  registering its writers and sending every unacknowledged request again; with one
  node only (a tree) it stays, and its writers write their segments to the store
  themselves once their ack deadline passes.
* **A restart** ``restart_s`` after the death: a fresh node core, same id and address,
  a new identity (a reconnecting ROUTER peer); the nodes that lost it get
  ``UpstreamUp`` (they return after their ``parent_retry_after`` hold-down), its tree
  clients send to it again at once (their socket reconnects), its DAG clients return
  once their probe has been up for ``hold_down_s`` (``NodePreference.should_return``),
  withdrawing their writers from the neighbour and sending what is unacknowledged again.

Not modelled: a node that hangs without dying (the real links count it lost the same
way), the coordinator noticing anything (tasks keep running), markers being lost
where the real client does not re-send them (here every request is re-sent), the
cost of re-registering.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from dstltree.aggregator.events import UpstreamLost, UpstreamUp
from dstltree.client.failover import NodePreference
from dstltree.client.wire import PersistRequest, Register, Unregister
from dstltree.simulations.config import SimConfig
from dstltree.simulations.nodeshell import NodeCoreCluster

if TYPE_CHECKING:
    from dstltree.simulations.cluster import SimResult

__all__ = ["LAYOUTS", "NodeFailures", "compare_layouts", "failure_schedule"]

_SCHEDULE_STREAM = 0x5EED_FA11  # the schedule's own random stream, beside cfg.seed


def failure_schedule(cfg: SimConfig, horizon_s: float) -> list[tuple[float, int]]:
    """(time of death in seconds, node index) of every failure before ``horizon_s``,
    in time order: per node a Poisson process of ``cfg.node_failures_per_hour`` per
    hour from ``cfg.startup_s``, paused for ``cfg.restart_s`` after each death (the
    times :class:`NodeFailures` kills at). Deterministic for ``cfg.seed``; [] when
    failures are off."""
    out: list[tuple[float, int]] = []
    for v in range(cfg.executors if cfg.failures else 0):
        for t in _deaths(cfg, v):
            if t >= horizon_s:
                break
            out.append((t, v))
    return sorted(out)


def _deaths(cfg: SimConfig, v: int) -> Iterator[float]:
    """Node ``v``'s times of death (seconds), for ever: a stream of its own per node."""
    rng = np.random.default_rng([cfg.seed, _SCHEDULE_STREAM, v])
    mean = 3600.0 / cfg.node_failures_per_hour
    t = cfg.startup_s + float(rng.exponential(mean))
    while True:
        yield t
        t += cfg.restart_s + float(rng.exponential(mean))


class NodeFailures:
    """Kills and restarts the nodes of ``cluster`` on :func:`failure_schedule` (see the
    module docstring). ``deaths``: their times (seconds); counters: ``failovers``
    (clients moved to another node after losing theirs) and ``returns`` (clients back
    on their own node after the hold-down)."""

    def __init__(self, cluster: NodeCoreCluster) -> None:
        self.cluster = cluster
        self.cfg = cfg = cluster.cfg
        ids = cluster.ids
        n = len(ids)
        self.deaths: list[float] = []  # times of death (seconds)
        self.failovers = 0
        self.returns = 0
        self.generation = [0] * n
        self._deaths = [_deaths(cfg, v) for v in range(n)]
        kids: defaultdict[str, list[str]] = defaultdict(list)
        for node in ids:
            for p in cluster.tree.parents(node):
                kids[p].append(node)
        self.below = [self._descendants(node, kids) for node in ids]
        neighbour = cfg.second_parents and n > 1
        self.prefs = [
            NodePreference(
                (ids[i], ids[(i + 1) % n]) if neighbour else (ids[i],), hold_down=cfg.hold_down_s
            )
            for i in range(n)
        ]

    def _descendants(self, node: str, kids: dict[str, list[str]]) -> list[int]:
        seen: set[str] = set()
        todo = list(kids.get(node, ()))
        while todo:
            k = todo.pop()
            if k not in seen:
                seen.add(k)
                todo.extend(kids.get(k, ()))
        return sorted(self.cluster.index[k] for k in seen)

    def start(self) -> None:
        """Schedule each node's first death; each restart schedules the next one (the
        run ends when its checkpoints are done, whatever is still scheduled)."""
        for v, deaths in enumerate(self._deaths):
            self.cluster.at(next(deaths), self._kill, v)

    # -- a death -------------------------------------------------------------------------
    def _kill(self, v: int) -> None:
        cl = self.cluster
        cl.hosts[v].dead = True
        self.deaths.append(cl.env.now)
        self.generation[v] += 1
        gen = self.generation[v]
        cl.at(cl.env.now + self.cfg.failure_detection_s, self._detected, v, gen)
        cl.at(cl.env.now + self.cfg.restart_s, self._restart, v)

    def _detected(self, v: int, gen: int) -> None:
        """The peers of dead node ``v`` notice (if it has not come back meanwhile)."""
        cl = self.cluster
        if self.generation[v] != gen or not cl.hosts[v].dead:
            return
        now, address = cl.env.now, cl.ids[v]
        for u in self.below[v]:
            if not cl.hosts[u].dead:
                cl.handle(u, UpstreamLost(now, address))
        for i, pref in enumerate(self.prefs):
            if cl.route[i] == v and pref.lost(now) is not None:
                self.failovers += 1
                self._switch(i, pref.current)

    def _switch(self, i: int, target: int) -> None:
        """Client ``i`` sends to node ``target`` from now on (its index in ``prefs[i]``):
        its writers registered there, every unacknowledged request sent again."""
        cl = self.cluster
        v = cl.index[self.prefs[i].addresses[target]]
        cl.disconnect(i)
        cl.route[i] = v
        for log in cl.logs[i]:
            cl.deliver(i, v, Register(log))
        again = [PersistRequest(rid, item) for rid, item in cl.unacknowledged(i)]
        if again:
            cl.send_requests(i, again)

    # -- a restart -----------------------------------------------------------------------
    def _restart(self, v: int) -> None:
        cl = self.cluster
        cl.restart(v, self.generation[v])
        cl.at(next(self._deaths[v]), self._kill, v)
        now, address = cl.env.now, cl.ids[v]
        for u in self.below[v]:
            if not cl.hosts[u].dead:
                cl.handle(u, UpstreamUp(now, address))
        for i, pref in enumerate(self.prefs):
            if pref.addresses[0] != address:
                continue
            if pref.current != 0:
                pref.probe_seen(True, now)
                cl.at(now + pref.hold_down, self._maybe_return, i, self.generation[v])

    def _maybe_return(self, i: int, gen: int) -> None:
        """Client ``i`` returns to its own node if its probe stayed up for the
        hold-down (the node did not die again meanwhile)."""
        cl = self.cluster
        pref = self.prefs[i]
        home = cl.index[pref.addresses[0]]
        if self.generation[home] != gen or cl.hosts[home].dead:
            return
        left = cl.route[i]
        if pref.should_return(cl.env.now) is None:
            if pref.current != 0:  # its own hold-down has not passed yet: look again then
                cl.at(cl.env.now + pref.hold_down, self._maybe_return, i, gen)
            return
        for log in cl.logs[i]:  # the node left stops counting these writers
            cl.deliver(i, left, Unregister(log))
        self.returns += 1
        self._switch(i, 0)


LAYOUTS = {"tree": False, "dag": True}  # layout name -> second_parents


def compare_layouts(cfg: SimConfig) -> dict[str, dict[str, SimResult]]:
    """``cfg`` as a tree (one way up) and as a DAG (second parents, a neighbour's node
    for each executor's writers), each without and with ``cfg``'s node failures:
    ``{"tree": {"without": r, "with": r}, "dag": {...}}``, all on ``cfg.seed``.
    ValueError when ``cfg`` has no node failures."""
    from dataclasses import replace

    from dstltree.simulations.cluster import simulate

    if not cfg.failures:
        raise ValueError("compare_layouts needs node_failures_per_hour > 0")
    return {
        name: {
            "without": simulate(replace(cfg, second_parents=dag, node_failures_per_hour=0.0)),
            "with": simulate(replace(cfg, second_parents=dag)),
        }
        for name, dag in LAYOUTS.items()
    }
