"""The floor of one checkpoint on an object store: the least implementation of the work
a checkpoint of the demo does on the completion path's storage (BENCHMARKS.md,
"Checkpoints on object stores").

Per checkpoint: one changelog object of ``object_bytes`` written (what the tree
persists for it), then one conditional create of ``record_bytes`` (the commit record),
through the same store and fault-injecting wrapper the demo uses
(``--dfs-faults SPEC``). ``checkpoints`` such pairs start ``interval_s`` apart and
overlap (no queue of any kind: as many threads as needed), once with the create
hedged as the coordinator hedges it (coordinator/hedged_create.py) and once not.
Durations are seconds from the start of the object write.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from dstltree.coordinator.hedged_create import HedgedCreate
from dstltree.stats import percentile
from dstltree.storage.store import ObjectStore
from dstltree.storage.targets import with_faults


@dataclass(frozen=True)
class FloorFigures:
    """Seconds, over the checkpoints of one turn: the object write alone and the object
    then the create (p50, p99, max); ``hedged``: whether the create was hedged."""

    hedged: bool
    object_p50: float
    object_p99: float
    total_p50: float
    total_p99: float
    total_max: float


def commit_floor(
    spec: str = "flip158-s3",
    checkpoints: int = 150,
    interval_s: float = 0.3,
    object_bytes: int = 100_000,
    record_bytes: int = 6_000,
    base: str | None = None,
) -> list[FloorFigures]:
    """Both turns (create not hedged, then hedged). ``base``: a local folder for the
    files (default: a new temporary one). Raises ValueError for a bad fault spec,
    StorageError when the store fails."""
    root = base or tempfile.mkdtemp(prefix="dstl-commit-floor-")
    url, opts = with_faults(root.rstrip("/") + "/job", {}, spec)
    store = ObjectStore(url, opts)
    return [
        _turn(store, hedged, checkpoints, interval_s, object_bytes, record_bytes)
        for hedged in (False, True)
    ]


def _turn(
    store: ObjectStore, hedged: bool, n: int, interval_s: float, obj: int, rec: int
) -> FloorFigures:
    data, record = b"o" * obj, b"r" * rec
    hedge = HedgedCreate()

    def one(i: int) -> tuple[float, float]:
        t0 = time.monotonic()
        store.put(store.new_object_path(), data)
        t1 = time.monotonic()
        path = store.join("checkpoints", f"floor-{int(hedged)}-{i:06d}.json")
        if hedged:
            hedge.run(lambda: store.put(path, record, exclusive=True))
        else:
            store.put(path, record, exclusive=True)
        return t1 - t0, time.monotonic() - t0

    futures: list[Future[tuple[float, float]]] = []
    with ThreadPoolExecutor(max(4, n)) as pool:
        start = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, start + i * interval_s - time.monotonic()))
            futures.append(pool.submit(one, i))
        results = [f.result() for f in futures]
    hedge.close()
    objects = [r[0] for r in results]
    totals = [r[1] for r in results]
    return FloorFigures(
        hedged,
        percentile(objects, 50),
        percentile(objects, 99),
        percentile(totals, 50),
        percentile(totals, 99),
        max(totals),
    )
