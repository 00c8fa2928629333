"""Simulation parameters and the synthetic workload (bytes per task per checkpoint)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dstltree.topology.latency import HedgingPolicy
from dstltree.topology.tree import Tree, kary_tree

__all__ = ["DESIGNS", "DISTRIBUTIONS", "Design", "SimConfig", "SimWorkload"]

Design = Literal["task", "executor", "tree", "tree-noplan"]
DESIGNS: tuple[Design, ...] = ("task", "executor", "tree", "tree-noplan")
DISTRIBUTIONS = ("constant", "lognormal", "skewed")
MiB = 1024 * 1024


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Sizes in bytes, times in seconds, rates per second.

    Cluster: ``executors`` x ``tasks_per_executor`` tasks, one aggregator node per
    executor arranged as ``tree`` (or a k-ary tree of ``branching``). Workload:
    ``bytes_per_checkpoint`` per task, drawn from ``distribution`` (``constant``;
    ``lognormal`` with mean ``bytes_per_checkpoint`` and shape ``sigma``; ``skewed``:
    a ``hot_fraction`` of executors change ``hot_factor`` times as much). Network:
    ``hop_latency_s`` per hop, ``node_bandwidth`` bytes/s per node NIC (each way),
    ``cpu_per_message_s`` per message received by a node. Storage: ``dfs_latency``
    model name, ``put_rate_limit`` per prefix over ``prefixes`` prefixes, hedging after
    ``hedge_timeout_s`` (None: off) up to ``max_attempts``. The ``tree`` design plans
    windows of ``plan_window`` checkpoints; the first ``warmup_checkpoints`` (default:
    one plan window) run in every design but are left out of the results.
    ``dfs_latency_scale`` scales the model (:meth:`dstltree.topology.latency.LatencyModel.scaled`,
    as ``scale=`` of the fault-injecting filesystem).

    The tree designs run the real node core (:mod:`dstltree.simulations.nodeshell`)
    with ``persist_delay_s`` and a parent timeout of ``parent_timeout_s`` per level
    of depth (``TopologyConfig.ack_timeout``), reporting Stats every ``stats_interval_s``
    (the node's default). Writers register and nodes report from
    time 0; checkpoint 0 is triggered at ``startup_s``. ``check_invariants`` builds the
    node cores with ``validate=True`` (:meth:`NodeCore.validate` after every event;
    NodeInvariantError; slow, for tests).

    Hedging (:class:`dstltree.topology.latency.HedgingPolicy`, the real uploader's
    rule, see :meth:`hedging`): ``hedge_copies`` writes of objects up to
    ``hedge_copies_max_bytes`` at once, ``hedge_adaptive_percentile`` of recent
    latencies as the timeout (None: ``hedge_timeout_s``), ``throttle_aware`` (False:
    hedge even while the store throttles, the rule before throttling was seen).

    Node failures (tree designs only; :mod:`dstltree.simulations.failures`): every node,
    the root included, dies ``node_failures_per_hour`` times per node-hour on average
    (Poisson, from ``startup_s``; 0: never) and comes back ``restart_s`` later with
    the same id and an empty state; its peers notice ``failure_detection_s`` after the
    death (three missed ZeroMQ heartbeats of the real links: 0.3 s); a way back to a
    node that returned is taken again after ``hold_down_s`` (the client's
    ``hold_down`` and the node's ``parent_retry_after``). ``second_parents``: the
    k-ary tree gets :func:`dstltree.topology.tree.second_parent_indices`' second
    parents and every executor's writers a neighbour's node (the next executor's, as
    ``sparkplug.task.find_nodes``) to move to when theirs is lost, the default of a
    real topology (a given ``tree`` keeps its own parents); False: one way up each,
    a writer whose node is lost waits out its ack timeout (``parent_timeout_s`` x
    (tree height + 1), as the job sets it) and writes its segment to the store
    itself. Without failures the two differ only where an upstream ack times out (a
    slow store): the DAG's node then re-homes to its second parent, the tree's to its
    grandparent.

    ``coordinator`` (tree designs only): the real coordinator core triggers and
    completes the checkpoints (:mod:`dstltree.simulations.coordshell`): the next one
    ``checkpoint_interval_s`` after the previous completed, at most one in flight
    (FLIP-158), latency from its trigger to its completion. False (the default: a run
    takes about three times as long, see docs/tuning.md), and always for the ``task``
    and ``executor`` designs: checkpoint ``c`` is triggered at ``startup_s + c *
    checkpoint_interval_s`` (they may overlap), latency to the last writer's ack.
    """

    executors: int = 7
    tasks_per_executor: int = 4
    branching: int = 4
    tree: Tree | None = field(default=None, compare=False)
    bytes_per_checkpoint: int = 256 * 1024
    distribution: str = "constant"
    sigma: float = 1.0
    hot_fraction: float = 0.1
    hot_factor: float = 10.0
    checkpoints: int = 20
    checkpoint_interval_s: float = 1.0
    warmup_checkpoints: int | None = None
    plan_window: int = 4
    target_object_bytes: int = 4 * MiB
    design: Design = "tree"
    dfs_latency: str = "flip158-s3"
    dfs_latency_scale: float = 1.0
    hedge_timeout_s: float | None = 1.0
    max_attempts: int = 3
    put_rate_limit: float = 3500.0
    prefixes: int = 1
    hop_latency_s: float = 0.0005
    node_bandwidth: float = 1.25e9
    cpu_per_message_s: float = 50e-6
    persist_delay_s: float = 0.05
    parent_timeout_s: float = 2.0
    stats_interval_s: float = 0.2
    startup_s: float = 1.0
    check_invariants: bool = False
    hedge_copies: int = 1
    hedge_copies_max_bytes: int = 8 * MiB
    hedge_adaptive_percentile: float | None = None
    throttle_aware: bool = True
    coordinator: bool = False
    node_failures_per_hour: float = 0.0
    restart_s: float = 2.0
    failure_detection_s: float = 0.3
    hold_down_s: float = 5.0
    second_parents: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.design not in DESIGNS:
            raise ValueError(f"design must be one of {', '.join(DESIGNS)}, got {self.design!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}")
        if self.executors < 1 or self.tasks_per_executor < 1 or self.checkpoints < 1:
            raise ValueError("executors, tasks per executor and checkpoints must be >= 1")
        if self.tree is not None and len(self.tree) != self.executors:
            raise ValueError(
                f"the topology has {len(self.tree)} nodes but executors is "
                f"{self.executors} (one node per executor)"
            )
        if self.branching < 1 or self.target_object_bytes < 1 or self.bytes_per_checkpoint < 0:
            raise ValueError("branching and target_object_bytes must be >= 1, bytes >= 0")
        if self.dfs_latency_scale <= 0 or self.persist_delay_s < 0 or self.startup_s < 0:
            raise ValueError("dfs_latency_scale must be > 0, persist_delay_s and startup_s >= 0")
        if self.parent_timeout_s <= 0 or self.stats_interval_s <= 0:
            raise ValueError("parent_timeout_s and stats_interval_s must be > 0")
        self.hedging()  # validates the hedging fields
        if self.checkpoint_interval_s <= 0 or self.plan_window < 1:
            raise ValueError("checkpoint_interval_s must be > 0 and plan_window >= 1")
        self._check_failures()

    def _check_failures(self) -> None:
        if self.node_failures_per_hour < 0 or self.restart_s <= 0:
            raise ValueError("node_failures_per_hour must be >= 0 and restart_s > 0")
        if self.failure_detection_s < 0 or self.hold_down_s < 0:
            raise ValueError("failure_detection_s and hold_down_s must be >= 0")
        if self.node_failures_per_hour > 0 and self.design not in ("tree", "tree-noplan"):
            raise ValueError("node failures need a tree design (tree, tree-noplan)")

    @property
    def failures(self) -> bool:
        """Nodes die in this run."""
        return self.node_failures_per_hour > 0

    def hedging(self) -> HedgingPolicy:
        """The hedging rule of the simulated store. Raises ValueError for bad values."""
        return HedgingPolicy(
            self.hedge_timeout_s,
            self.max_attempts,
            copies=self.hedge_copies,
            copies_max_bytes=self.hedge_copies_max_bytes,
            adaptive_percentile=self.hedge_adaptive_percentile,
            throttle_aware=self.throttle_aware,
        )

    @property
    def warmup(self) -> int:
        return self.plan_window if self.warmup_checkpoints is None else self.warmup_checkpoints

    def build_tree(self) -> Tree:
        """``tree``, else the k-ary tree of ``branching`` (with ``second_parents``)."""
        if self.tree is not None:
            return self.tree
        return kary_tree(self.executors, self.branching, second_parents=self.second_parents)


class SimWorkload:
    """Bytes per task per checkpoint, shape (executors, tasks), int64; deterministic
    for a seed. Executor i is node ``tree.nodes[i]``."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.scale = np.ones((cfg.executors, 1))
        if cfg.distribution == "skewed":
            hot = math.ceil(cfg.hot_fraction * cfg.executors)
            self.scale[self.rng.permutation(cfg.executors)[:hot]] = cfg.hot_factor

    def next(self) -> np.ndarray:
        cfg = self.cfg
        shape = (cfg.executors, cfg.tasks_per_executor)
        b = float(cfg.bytes_per_checkpoint)
        if cfg.distribution == "lognormal" and b > 0:
            mu = math.log(b) - cfg.sigma**2 / 2
            x = self.rng.lognormal(mu, cfg.sigma, shape)
        else:
            x = np.full(shape, b)
        return np.rint(x * self.scale).astype(np.int64)
