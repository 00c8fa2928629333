"""The discrete-event cluster simulator (simpy): one checkpoint after another through one
of the designs, per executor and per node (never per byte).

Designs (as in ``dstl bench``):

* ``task`` - every task writes its own object per checkpoint (Spark RocksDB changelog);
* ``executor`` - each executor's node writes one object per checkpoint (Flink DSTL);
* ``tree`` - collectors from :func:`dstltree.topology.plan.compute_plan` over a
  :class:`dstltree.topology.plan.ByteEstimator` of each node's own bytes; every node sends its
  changesets one hop, straight to its collector, which cuts an object each time it
  holds the target and writes the rest once every routed node has sent. Window 0 has
  no plan and runs as ``tree-noplan`` (docs/design.md: no plan means forward to the parent);
* ``tree-noplan`` - hop-by-hop: a node waits for its own tasks and one message from
  each child, then writes (cut at the target) if it holds at least the target or is
  the root, otherwise forwards all it holds to its parent.

A checkpoint's latency runs from its trigger (all tasks at once) to the last ack
reaching a task: object durable plus one hop per node the ack crosses back. Nodes have
a FIFO send queue and a FIFO receive queue (``node_bandwidth`` each way) and pay
``cpu_per_message_s`` per message received (tasks' segments to their own node count).
``relay_fraction`` is the bytes sent onward by nodes that did not produce them,
divided by all bytes (a byte relayed twice counts twice).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from dstltree.simulations.config import SimConfig, SimWorkload
from dstltree.simulations.storage import SimulatedStore, StoreCounters, Throttle
from dstltree.topology.latency import HedgingPolicy, get_model
from dstltree.topology.plan import ByteEstimator, TreePlan, compute_plan, window_of

__all__ = ["SimResult", "simulate"]


@dataclass(frozen=True)
class SimResult:
    """Measured checkpoints only. Latencies in ms, sizes in bytes, ``wall_s`` seconds."""

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

    @property
    def requests_per_second(self) -> float:
        return self.requests_per_checkpoint / self.checkpoint_interval_s

    @property
    def within_rate_limit(self) -> bool:
        """No request was throttled and the PUT rate stays under the limit."""
        return self.throttled_requests == 0 and self.requests_per_second <= self.put_rate_limit

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["requests_per_second"] = self.requests_per_second
        return d


@dataclass
class _Batch:
    """One node's batch in one checkpoint (node_rules): items (one per writer), bytes,
    bytes received from other nodes, the most hops any item took, and a generation
    number that invalidates a pending delay flush."""

    items: int = 0
    persisted: int = 0
    nbytes: int = 0
    foreign: int = 0
    hops: int = 0
    first_at: float = 0.0
    gen: int = 0


class _Sim:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.env = simpy.Environment()
        self.tree = cfg.build_tree()
        self.ids = self.tree.nodes
        index = {n: i for i, n in enumerate(self.ids)}
        self.parent = [index.get(self.tree.parent(n) or "", -1) for n in self.ids]
        self.n_children = [len(self.tree.children(n)) for n in self.ids]
        self.index = index
        rng = random.Random(cfg.seed)
        model = get_model(cfg.dfs_latency)
        if cfg.dfs_latency_scale != 1.0:
            model = model.scaled(cfg.dfs_latency_scale)
        self.store = SimulatedStore(
            model,
            HedgingPolicy(cfg.hedge_timeout_s, cfg.max_attempts),
            Throttle(cfg.put_rate_limit),
            rng,
            prefixes=cfg.prefixes,
        )
        self.workload = SimWorkload(cfg)
        self.estimator = ByteEstimator(history=cfg.plan_window)
        self.plan: TreePlan | None = None
        n = len(self.ids)
        self.cpu_free = [0.0] * n
        self.tx_free = [0.0] * n
        self.rx_free = [0.0] * n
        self.done: dict[int, float] = {}
        self.relayed: defaultdict[int, int] = defaultdict(int)
        # per checkpoint, per node: messages still awaited, bytes held, ack hops
        self.waiting: dict[int, list[int]] = {}
        self.held: dict[int, list[int]] = {}
        self.hops: dict[int, list[int]] = {}
        self.own: dict[int, np.ndarray] = {}
        self.open_nodes: dict[int, int] = {}  # nodes still gathering, per checkpoint
        # node_rules: plans per window, the plan per checkpoint, per (checkpoint, node) batch
        self.plans: dict[int, TreePlan] = {}
        self.cp_plan: dict[int, TreePlan | None] = {}
        self.batches: dict[int, list[_Batch]] = {}
        self.expected: dict[int, list[int]] = {}
        self.post_order = [index[n] for n in self.tree.post_order()]
        self.children = [[index[k] for k in self.tree.children(n)] for n in self.ids]

    # -- events -----------------------------------------------------------------------
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: fn(*args))

    def ack(self, c: int, t: float) -> None:
        if t > self.done[c]:
            self.done[c] = t

    def put_objects(self, c: int, nbytes: int, hops: int, cut: bool) -> None:
        """Write ``nbytes`` now as one object, or as objects of the target size and a
        remainder (``cut``); acks travel back ``hops`` hops."""
        t = self.env.now
        target = self.cfg.target_object_bytes
        sizes = [target] * (nbytes // target) + [nbytes % target] if cut else [nbytes]
        back = hops * self.cfg.hop_latency_s
        for s in sizes:
            if s > 0:
                self.ack(c, self.store.put(c, t, s) + back)
        self.ack(c, t + back)

    def send(
        self,
        c: int,
        src: int,
        dst: int,
        nbytes: int,
        hops: int,
        then: Callable[..., None],
        *extra: Any,
    ) -> None:
        """One message from node ``src`` to ``dst`` (one hop), delivered to
        ``then(c, dst, nbytes, hops, *extra)``."""
        bw = self.cfg.node_bandwidth
        start = max(self.env.now, self.tx_free[src])
        self.tx_free[src] = start + nbytes / bw
        self.at(
            self.tx_free[src] + self.cfg.hop_latency_s,
            self._receive,
            c,
            dst,
            nbytes,
            hops,
            then,
            *extra,
        )

    def _receive(
        self, c: int, dst: int, nbytes: int, hops: int, then: Callable[..., None], *extra: Any
    ) -> None:
        start = max(self.env.now, self.rx_free[dst])
        self.rx_free[dst] = start + nbytes / self.cfg.node_bandwidth
        self.cpu_free[dst] = max(self.rx_free[dst], self.cpu_free[dst]) + self.cfg.cpu_per_message_s
        self.at(self.cpu_free[dst], then, c, dst, nbytes, hops, *extra)

    # -- checkpoints --------------------------------------------------------------------
    def trigger(self, c: int) -> None:
        cfg = self.cfg
        t = self.env.now
        tasks = self.workload.next()
        own = tasks.sum(axis=1)
        self.done[c] = t
        design = cfg.design
        if cfg.node_rules and design in ("tree", "tree-noplan"):
            self._node_trigger(c, t, own)
            return
        if design == "tree" and c % cfg.plan_window == 0:
            w = window_of(c, cfg.plan_window)
            # the plan for window w was computed during window w-1 from its estimates
            self.plan = (
                None
                if w == 0
                else compute_plan(
                    self.tree,
                    self.estimator.estimate(),
                    cfg.target_object_bytes,
                    window=w,
                    plan_window=cfg.plan_window,
                )
            )
        if design == "tree":
            self.estimator.update(dict(zip(self.ids, own.tolist(), strict=True)))
        if design == "task":
            for s in tasks.ravel().tolist():
                if s > 0:
                    self.ack(c, self.store.put(c, t, s))
            return
        # every task hands its segment to its own node: one message each
        local = cfg.tasks_per_executor * cfg.cpu_per_message_s
        ready = [max(t, f) + local for f in self.cpu_free]
        self.cpu_free = ready
        own_l = own.tolist()
        if design == "executor":
            for i, r in enumerate(ready):
                self.at(r, self.put_objects, c, own_l[i], 0, False)
            return
        self.own[c] = own
        if design == "tree" and self.plan is not None:
            routes = self.plan.routes()
            collector = [self.index[routes[n]] for n in self.ids]
            waiting = [0] * len(self.ids)
            for w in collector:
                waiting[w] += 1
            self.waiting[c] = waiting
            self.open_nodes[c] = sum(1 for x in waiting if x)
            self.held[c] = [0] * len(self.ids)
            self.hops[c] = [0] * len(self.ids)
            for i, r in enumerate(ready):
                self.at(r, self._planned_send, c, i, collector[i], own_l[i])
            return
        self.waiting[c] = [1 + k for k in self.n_children]
        self.open_nodes[c] = len(self.ids)
        self.held[c] = [0] * len(self.ids)
        self.hops[c] = [0] * len(self.ids)
        for i, r in enumerate(ready):
            self.at(r, self._noplan_arrive, c, i, own_l[i], -1)

    def _planned_send(self, c: int, i: int, w: int, nbytes: int) -> None:
        if w == i:
            self._planned_arrive(c, i, nbytes, 0)
        else:
            self.send(c, i, w, nbytes, 1, self._planned_arrive)

    def _planned_arrive(self, c: int, w: int, nbytes: int, hops: int) -> None:
        held, hop = self.held[c], self.hops[c]
        held[w] += nbytes
        hop[w] = max(hop[w], hops)
        target = self.cfg.target_object_bytes
        while held[w] >= target:  # a collector cuts an object each time it holds the target
            self.put_objects(c, target, hop[w], cut=False)
            held[w] -= target
            if held[w] == 0:
                hop[w] = 0
        self.waiting[c][w] -= 1
        if self.waiting[c][w] == 0:
            self.put_objects(c, held[w], hop[w], cut=False)
            held[w] = 0
            self._release(c)

    def _noplan_arrive(self, c: int, i: int, nbytes: int, hops: int) -> None:
        held, hop = self.held[c], self.hops[c]
        held[i] += nbytes
        hop[i] = max(hop[i], hops + 1)
        self.waiting[c][i] -= 1
        if self.waiting[c][i]:
            return
        p = self.parent[i]
        h = held[i]
        if p < 0 or h >= self.cfg.target_object_bytes:
            self.put_objects(c, h, hop[i], cut=True)
            if p >= 0:  # report the subtree's bytes: a tiny message
                self.send(c, i, p, 0, -1, self._noplan_arrive)
        else:
            self.relayed[c] += h - int(self.own[c][i])
            self.send(c, i, p, h, hop[i], self._noplan_arrive)
        held[i] = 0
        self._release(c)

    # -- node_rules: the real node's batching and routing (aggregator.core) --------------
    def _node_plans(self, c: int, own: np.ndarray) -> None:
        """The plan of checkpoint ``c`` as the real root and nodes make it: window 0 has
        none (hop by hop); the root plans window w+1 when it first sees checkpoint
        ``w*N + N//2`` and every node decides from its estimates at that moment
        (``decide_local``, which ``compute_plan`` reproduces for the whole tree)."""
        cfg = self.cfg
        n = cfg.plan_window
        w = window_of(c, n)
        if cfg.design == "tree" and c - w * n == n // 2 and w + 1 not in self.plans:
            self.plans[w + 1] = compute_plan(
                self.tree,
                self.estimator.estimate(),
                cfg.target_object_bytes,
                window=w + 1,
                plan_window=n,
            )
            self.plans.pop(w - 2, None)
        self.cp_plan[c] = self.plans.get(w)
        self.cp_plan.pop(c - 2, None)
        self.estimator.update(dict(zip(self.ids, own.tolist(), strict=True)))

    def _expected_writers(self, c: int) -> list[int]:
        """Per node, the writers whose persist requests reach its batch in checkpoint
        ``c`` (``NodeCore.expected_writers``): its own if its plan names another collector,
        else its residual writers, from children's reports of the previous checkpoint."""
        tasks = self.cfg.tasks_per_executor
        plan, prev = self.cp_plan[c], self.cp_plan.get(c - 1)
        below = [0] * len(self.ids)
        for v in self.post_order:
            below[v] = tasks
            for k in self.children[v]:
                writes = prev is not None and prev.nodes[self.ids[k]].writes
                below[v] += 0 if writes else below[k]
        if plan is None:
            return below
        return [tasks if plan.nodes[n].collector != n else below[i] for i, n in enumerate(self.ids)]

    def _node_trigger(self, c: int, t: float, own: np.ndarray) -> None:
        cfg = self.cfg
        self._node_plans(c, own)
        self.expected[c] = self._expected_writers(c)
        self.batches[c] = [_Batch() for _ in self.ids]
        local = cfg.tasks_per_executor * cfg.cpu_per_message_s
        ready = [max(t, f) + local for f in self.cpu_free]
        self.cpu_free = ready
        own_l = own.tolist()
        for i, r in enumerate(ready):  # the tasks' segments reach their own node's batch
            self.at(r, self._node_arrive, c, i, own_l[i], 0, cfg.tasks_per_executor, False)

    def _node_arrive(
        self, c: int, v: int, nbytes: int, hops: int, items: int, foreign: bool
    ) -> None:
        b = self.batches[c][v]
        if b.items == 0:
            b.first_at = self.env.now
            b.gen += 1
            self.at(self.env.now + self.cfg.persist_delay_s, self._node_delay, c, v, b.gen)
        b.items += items
        b.persisted += items
        b.nbytes += nbytes
        b.foreign += nbytes if foreign else 0
        b.hops = max(b.hops, hops)
        if b.nbytes >= self.cfg.target_object_bytes:
            self._node_flush(c, v, "size")
        elif b.persisted >= self.expected[c][v]:
            self._node_flush(c, v, "all-persisted")

    def _node_delay(self, c: int, v: int, gen: int) -> None:
        b = self.batches[c][v]
        if b.gen == gen and b.items:
            self._node_flush(c, v, "delay")

    def _node_flush(self, c: int, v: int, reason: str) -> None:
        """``NodeCore._flush``: the whole batch goes to one route; a write is ONE object."""
        b = self.batches[c][v]
        plan = self.cp_plan.get(c)
        if plan is not None:
            dst = self.index[plan.nodes[self.ids[v]].collector]
        elif reason == "size" or self.parent[v] < 0:
            dst = v
        else:
            dst = self.parent[v]
        if dst == v:
            self.put_objects(c, b.nbytes, b.hops, cut=False)
        else:
            self.relayed[c] += b.foreign
            self.send(c, v, dst, b.nbytes, b.hops + 1, self._node_arrive, b.items, True)
        b.items = b.nbytes = b.foreign = b.hops = 0
        # client.batching.Batch.take: a size cut keeps the count of an incomplete checkpoint
        if reason != "size" or b.persisted >= self.expected[c][v]:
            b.persisted = 0
        b.gen += 1

    def _release(self, c: int) -> None:
        """One node is done with checkpoint ``c``; free its state after the last."""
        self.open_nodes[c] -= 1
        if self.open_nodes[c] == 0:
            for d in (self.waiting, self.held, self.hops, self.own, self.open_nodes):
                d.pop(c, None)

    def checkpoints(self):  # simpy process
        total = self.cfg.warmup + self.cfg.checkpoints
        for c in range(total):
            self.trigger(c)
            if c + 1 < total:
                yield self.env.timeout(self.cfg.checkpoint_interval_s)


def simulate(cfg: SimConfig) -> SimResult:
    """Run one configuration; deterministic for ``cfg.seed``. ValueError for an unknown
    latency model (see :func:`dstltree.topology.latency.get_model`)."""
    t0 = time.perf_counter()
    sim = _Sim(cfg)
    sim.env.process(sim.checkpoints())
    sim.env.run()
    measured = range(cfg.warmup, cfg.warmup + cfg.checkpoints)
    lat = np.array([(sim.done[c] - c * cfg.checkpoint_interval_s) * 1000 for c in measured])
    pct = {
        k: float(np.percentile(lat, q))
        for k, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9))
    }
    tot = StoreCounters()
    for c in measured:
        k = sim.store.counters[c]
        tot.objects += k.objects
        tot.requests += k.requests
        tot.throttled += k.throttled
        tot.hedged += k.hedged
        tot.bytes += k.bytes
    relayed = sum(sim.relayed[c] for c in measured)
    n = cfg.checkpoints
    return SimResult(
        design=cfg.design,
        executors=cfg.executors,
        tasks_per_executor=cfg.tasks_per_executor,
        branching=cfg.branching,
        target_object_bytes=cfg.target_object_bytes,
        checkpoints=n,
        checkpoint_interval_s=cfg.checkpoint_interval_s,
        checkpoint_ms=pct,
        requests_per_checkpoint=tot.requests / n,
        objects_per_checkpoint=tot.objects / n,
        mean_object_bytes=tot.bytes / tot.objects if tot.objects else 0.0,
        relay_fraction=relayed / tot.bytes if tot.bytes else 0.0,
        throttled_requests=tot.throttled,
        hedged_requests=tot.hedged,
        put_rate_limit=cfg.put_rate_limit,
        wall_s=time.perf_counter() - t0,
    )
