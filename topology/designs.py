"""The ways of writing changelog objects that the benchmark and the simulator compare
(docs/design.md, "Where numbers come from").

- ``task``: one object per writer per checkpoint (Spark's RocksDB changelog style).
- ``executor``: one object per executor per checkpoint (Flink DSTL style).
- ``tree``: aggregator nodes with plans (this project).
- ``tree-noplan``: the same nodes forwarding hop by hop, without plans.
"""

from __future__ import annotations

from typing import Literal

Design = Literal["task", "executor", "tree", "tree-noplan"]
DESIGNS: tuple[Design, ...] = ("task", "executor", "tree", "tree-noplan")
TREE_DESIGNS: tuple[Design, ...] = ("tree", "tree-noplan")
