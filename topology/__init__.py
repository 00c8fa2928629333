"""Pure topology code, no I/O beyond reading a YAML file: the topology schema, the tree,
and (later) the plan policy. Used unchanged by the aggregator and the simulator."""

from dstltree.topology.config import NodeSpec, TopologyConfig, TopologyError, load_topology
from dstltree.topology.tree import Tree, kary_tree

__all__ = [
    "NodeSpec",
    "TopologyConfig",
    "TopologyError",
    "Tree",
    "kary_tree",
    "load_topology",
]
