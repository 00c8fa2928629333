"""``dstl bench``: one synthetic changelog workload through four designs on the same
machine and storage: ``task`` (one object per writer per checkpoint, Spark
RocksDB changelog style), ``executor`` (one object per executor process per checkpoint,
Flink DSTL style), ``tree`` (aggregator node processes with plans) and ``tree-noplan``
(the same, forwarding hop by hop).

Modules: :mod:`.workload` (bytes per writer per checkpoint), :mod:`.worker` (the
per-executor process), :mod:`.nodes` (the node processes),
:mod:`.storage` (base paths, fault injection, local S3), :mod:`.designs` (the driver),
:mod:`.metrics` and :mod:`.report`. ``dstl bench hotpath``: :mod:`.hotpath` (with
:mod:`.hotpath_local`, :mod:`.hotpath_net` and :mod:`.hotpath_raw`), each hot-path
figure next to its floor.
"""

from dstltree.topology.designs import DESIGNS

__all__ = ["DESIGNS"]
