"""The discrete-event cluster simulator (simpy): one checkpoint after another through one
of the designs.

Designs (as in ``dstl bench``):

* ``task`` - every task writes its own object per checkpoint (Spark RocksDB changelog):
  no node, no batching rule, one PUT per task with bytes;
* ``executor`` - each executor writes one object per checkpoint once its tasks'
  segments reached it, one message each (Flink DSTL; ``dstl bench``'s executor
  design, whose client flushes when all its writers persisted);
* ``tree`` and ``tree-noplan`` - the real node core, one
  :class:`dstltree.aggregator.core.NodeCore` per executor, plans on (the root plans, as
  the real one does) or off (hop by hop); the shell around it is
  :mod:`dstltree.simulations.nodeshell`, which says what it models and what not.

Triggers (writers register and nodes exchange Stats from time 0):

* ``coordinator`` on (tree designs only; off by default): the real coordinator core
  triggers and completes the checkpoints (:mod:`dstltree.simulations.coordshell`, which
  says what it models and what not). At most one checkpoint is in flight: the next is
  triggered ``checkpoint_interval_s`` after the previous one completed (FLIP-158, "At
  most 1 concurrent checkpoint"), the first at ``startup_s`` (or once every task said
  hello), so checkpoints never overlap. A checkpoint's latency runs from the core's
  trigger to its completion (every task acknowledged, the metadata written);
  ``writers_ms`` from the same trigger to the last writer's ack.
* ``coordinator`` off, and the ``task`` and ``executor`` designs always: checkpoint
  ``c`` is triggered at ``startup_s + c * checkpoint_interval_s`` whatever the others
  do (checkpoints may overlap); its latency runs from its trigger (all tasks at once)
  to the last writer's ack (``writers_ms`` is the same).

``relay_fraction`` is the bytes sent onward by nodes that did not produce them, divided
by all bytes written (a byte relayed twice counts twice).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from dstltree.simulations.config import SimConfig, SimWorkload
from dstltree.simulations.coordshell import CoordinatorCluster
from dstltree.simulations.failures import NodeFailures
from dstltree.simulations.gcpolicy import rare_collections
from dstltree.simulations.nodeshell import NodeCoreCluster
from dstltree.simulations.storage import SimulatedStore, Throttle
from dstltree.topology.designs import TREE_DESIGNS
from dstltree.topology.latency import get_model

__all__ = ["SimResult", "simulate"]


@dataclass(frozen=True)
class SimResult:
    """Measured checkpoints only. Latencies in ms (``checkpoint_ms`` percentiles,
    ``each_checkpoint_ms`` per checkpoint: from its trigger to its completion by the
    coordinator core when ``coordinator``, else to the last writer's ack;
    ``writers_ms`` percentiles from the trigger to the last writer's ack), sizes in
    bytes, ``coordinator_ms`` percentiles from the last writer's ack to the
    completion (the coordinator's share: the ack's hop, the acks queued for its CPU,
    the metadata write; empty without the coordinator), ``wall_s`` seconds (the
    simulation's own run time). Requests are the store's PUT attempts, counted under
    the first checkpoint of each object;
    ``objects_each_checkpoint`` counts, per checkpoint, the objects holding its
    segments (an object holding two checkpoints counts in both; writers' DFS fallbacks
    included, ``fallback_segments`` of them). Hedging: ``hedge_copies`` extra attempts
    started with the first, ``hedges_skipped_throttled`` hedges or copies not started
    because the store throttled, ``hedges_repeated_throttled`` hedges of uploads
    already throttled (uploads repeated because of throttling).

    Node failures (:mod:`dstltree.simulations.failures`; the whole run, warm-up
    included): ``node_deaths`` nodes killed up to the last checkpoint's trigger (with
    fixed triggers the same in every layout on one seed), ``failovers`` executor clients moved to
    their neighbour's node, ``returns`` moved back after the hold-down, ``late_acks``
    acks of requests already acknowledged or written directly (each a second copy of
    a segment no handle references: an orphan for the registry's sweep),
    ``abandoned_writes`` objects whose node died while writing them."""

    design: str
    executors: int
    tasks_per_executor: int
    branching: int
    target_object_bytes: int
    checkpoints: int
    checkpoint_interval_s: float
    checkpoint_ms: dict[str, float]
    requests_per_checkpoint: float
    objects_per_checkpoint: float
    mean_object_bytes: float
    relay_fraction: float
    throttled_requests: int
    hedged_requests: int
    put_rate_limit: float
    wall_s: float
    each_checkpoint_ms: list[float] = field(default_factory=list)
    objects_each_checkpoint: list[int] = field(default_factory=list)
    fallback_segments: int = 0
    hedge_copies: int = 0
    hedges_skipped_throttled: int = 0
    hedges_repeated_throttled: int = 0
    coordinator: bool = False
    writers_ms: dict[str, float] = field(default_factory=dict)
    coordinator_ms: dict[str, float] = field(default_factory=dict)
    second_parents: bool = True
    node_failures_per_hour: float = 0.0
    restart_s: float = 0.0
    node_deaths: int = 0
    failovers: int = 0
    returns: int = 0
    late_acks: int = 0
    abandoned_writes: int = 0

    @property
    def requests_per_second(self) -> float:
        return self.requests_per_checkpoint / self.checkpoint_interval_s

    @property
    def within_rate_limit(self) -> bool:
        """No request was throttled and the PUT rate stays under one prefix's limit."""
        return self.under_limit(1)

    def under_limit(self, prefixes: int) -> bool:
        """No request was throttled and the PUT rate stays under ``put_rate_limit`` x
        ``prefixes`` (the limit is per prefix)."""
        return (
            self.throttled_requests == 0
            and self.requests_per_second <= self.put_rate_limit * prefixes
        )

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["requests_per_second"] = self.requests_per_second
        return d


class _Sim:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.env = simpy.Environment()
        rng = random.Random(cfg.seed)
        model = get_model(cfg.dfs_latency)
        if cfg.dfs_latency_scale != 1.0:
            model = model.scaled(cfg.dfs_latency_scale)
        self.store = SimulatedStore(
            model,
            cfg.hedging(),
            Throttle(cfg.put_rate_limit),
            rng,
            prefixes=cfg.prefixes,
        )
        self.workload = SimWorkload(cfg)
        self.nodes = (
            NodeCoreCluster(cfg, self.env, self.store) if cfg.design in TREE_DESIGNS else None
        )
        self.done: dict[int, float] = self.nodes.done if self.nodes else {}
        self.cpu_free = [0.0] * cfg.executors
        self.coord = (
            CoordinatorCluster(cfg, self.env, self.nodes, self.workload, model)
            if self.nodes is not None and cfg.coordinator
            else None
        )
        self.failures = (
            NodeFailures(self.nodes) if self.nodes is not None and cfg.failures else None
        )

    def start_nodes(self) -> None:
        """Writers register, nodes start their clocks, the failure schedule begins."""
        assert self.nodes is not None
        self.nodes.start()
        if self.failures is not None:
            self.failures.start()

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: fn(*args))

    def ack(self, c: int, t: float) -> None:
        if t > self.done[c]:
            self.done[c] = t

    def trigger(self, c: int) -> None:
        """Checkpoint ``c`` now: the tree designs hand it to the node cores; ``task``
        writes one object per task, ``executor`` one per executor once its tasks'
        segments reached it (one message each)."""
        cfg = self.cfg
        tasks = self.workload.next()
        if self.nodes is not None:
            self.nodes.trigger(c, tasks)
            return
        t = self.env.now
        self.done[c] = t
        if cfg.design == "task":
            for s in tasks.ravel().tolist():
                if s > 0:
                    self.ack(c, self.store.put(c, t, s))
            return
        local = cfg.tasks_per_executor * cfg.cpu_per_message_s
        self.cpu_free = [max(t, f) + local for f in self.cpu_free]
        for r, nbytes in zip(self.cpu_free, tasks.sum(axis=1).tolist(), strict=True):
            self.at(r, self._put_executor, c, nbytes)

    def _put_executor(self, c: int, nbytes: int) -> None:
        t = self.env.now
        self.ack(c, self.store.put(c, t, nbytes) if nbytes > 0 else t)

    def checkpoints(self):  # simpy process
        """Trigger every checkpoint on the fixed interval (no coordinator)."""
        if self.nodes is not None:
            self.start_nodes()
        yield self.env.timeout(self.cfg.startup_s)
        total = self.cfg.warmup + self.cfg.checkpoints
        for c in range(total):
            self.trigger(c)
            if c + 1 < total:
                yield self.env.timeout(self.cfg.checkpoint_interval_s)
        # the nodes' timers run forever: stop once every checkpoint completed
        while self.nodes is not None and self.nodes.left:
            yield self.env.timeout(self.cfg.checkpoint_interval_s)

    def run(self) -> None:
        """Every checkpoint to its end: the coordinator core triggers them, or the
        fixed interval."""
        if self.coord is not None:
            self.start_nodes()
            self.coord.start()
            self.env.run(until=self.coord.finished)
            return
        proc = self.env.process(self.checkpoints())
        self.env.run(until=proc if self.nodes is not None else None)

    def spans(self, c: int) -> tuple[float, float, float]:
        """Checkpoint ``c``'s trigger, end and last writer's ack (seconds)."""
        if self.coord is not None:
            start = self.coord.triggered[c]
            return start, self.coord.completed[c], self.done[c]
        start = self.cfg.startup_s + c * self.cfg.checkpoint_interval_s
        return start, self.done[c], self.done[c]


def _percentiles(ms: list[float]) -> dict[str, float]:
    return {
        k: float(np.percentile(ms, q))
        for k, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9))
    }


def simulate(cfg: SimConfig) -> SimResult:
    """Run one configuration; deterministic for ``cfg.seed``. ValueError for an unknown
    latency model (see :func:`dstltree.topology.latency.get_model`)."""
    t0 = time.perf_counter()
    with rare_collections():
        sim = _Sim(cfg)
        sim.run()
    measured = range(cfg.warmup, cfg.warmup + cfg.checkpoints)
    spans = [sim.spans(c) for c in measured]
    lat = [(end - start) * 1000 for start, end, _ in spans]
    writers = [(acked - start) * 1000 for start, _, acked in spans]
    coord = sim.coord
    tot = sim.store.totals(measured)
    nodes = sim.nodes
    objects = [nodes.objects[c] if nodes else sim.store.counters[c].objects for c in measured]
    relayed = sum(nodes.relayed[c] for c in measured) if nodes else 0
    n = cfg.checkpoints
    return SimResult(
        design=cfg.design,
        executors=cfg.executors,
        tasks_per_executor=cfg.tasks_per_executor,
        branching=cfg.branching,
        target_object_bytes=cfg.target_object_bytes,
        checkpoints=n,
        checkpoint_interval_s=cfg.checkpoint_interval_s,
        checkpoint_ms=_percentiles(lat),
        requests_per_checkpoint=tot.requests / n,
        objects_per_checkpoint=sum(objects) / n,
        mean_object_bytes=tot.bytes / tot.objects if tot.objects else 0.0,
        relay_fraction=relayed / tot.bytes if tot.bytes else 0.0,
        throttled_requests=tot.throttled,
        hedged_requests=tot.hedged,
        hedge_copies=tot.copies,
        hedges_skipped_throttled=tot.skipped_throttled,
        hedges_repeated_throttled=tot.repeated_throttled,
        put_rate_limit=cfg.put_rate_limit,
        wall_s=time.perf_counter() - t0,
        each_checkpoint_ms=[round(x, 3) for x in lat],
        objects_each_checkpoint=objects,
        fallback_segments=nodes.fallbacks if nodes else 0,
        coordinator=coord is not None,
        writers_ms=_percentiles(writers),
        coordinator_ms=_percentiles([(e - a) * 1000 for _, e, a in spans]) if coord else {},
        **_failure_counts(sim),
    )


def _failure_counts(sim: _Sim) -> dict[str, Any]:
    cfg, nodes, f = sim.cfg, sim.nodes, sim.failures
    last = sim.spans(cfg.warmup + cfg.checkpoints - 1)[0]  # the last trigger
    return {
        "second_parents": cfg.second_parents,
        "node_failures_per_hour": cfg.node_failures_per_hour,
        "restart_s": cfg.restart_s if cfg.failures else 0.0,
        "node_deaths": sum(1 for t in f.deaths if t <= last) if f else 0,
        "failovers": f.failovers if f else 0,
        "returns": f.returns if f else 0,
        "late_acks": nodes.late_acks if nodes else 0,
        "abandoned_writes": nodes.abandoned_writes if nodes else 0,
    }
