"""A discrete-event simulator (simpy) of a dstltree cluster for choosing the branching
factor and target object size; it drives the same plan policy as the real nodes
(``topology.plan``) and the same latency models (``topology.latency``). Issue 5."""

from dstltree.simulations.cluster import SimResult, simulate
from dstltree.simulations.config import DESIGNS, SimConfig

__all__ = ["DESIGNS", "SimConfig", "SimResult", "simulate"]
