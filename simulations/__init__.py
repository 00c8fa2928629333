"""A discrete-event simulator (simpy) of a dstltree cluster for choosing the branching
factor and target object size; its tree designs run the real node core
(``aggregator.core.NodeCore``, shell in ``simulations.nodeshell``), optionally the real
coordinator core (``coordinator.state.CoordinatorState``, shell in
``simulations.coordshell``) and the latency models of ``topology.latency``."""

from dstltree.simulations.cluster import SimResult, simulate
from dstltree.simulations.config import DESIGNS, SimConfig

__all__ = ["DESIGNS", "SimConfig", "SimResult", "simulate"]
