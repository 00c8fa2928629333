"""dstltree: a Durable Short-term Log for stateful stream processing on Spark.

Every part of the project is a subpackage of this one import package; the parts keep
their own top-level folders in the repository (see ``docs/architecture.md``):

- ``dstltree.topology``: topology schema, the tree, the plan policy (pure).
- ``dstltree.storage``: the storage boundary (store, retries, hedging, fault injection).
- ``dstltree.client``: the StateChangelog API for one task (writers, handles, format).
- ``dstltree.aggregator``: the node.
- ``dstltree.coordinator``: checkpoints, materialization, the shared state registry.
- ``dstltree.sparkplug``: the Spark integration (task runtime, sources, sinks).
- ``dstltree.demo``: the main job (``dstl demo``).
- ``dstltree.bench``: benchmarks and the simulator's validation.
- ``dstltree.cli``: the ``dstl`` command line.
- ``dstltree.simulations``: the cluster simulator.
- ``dstltree.stats``: summary statistics shared by reports.
"""

__version__ = "0.1.0"
