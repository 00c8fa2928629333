"""The checks and figures of ``dstl demo --engine structured-streaming``
(dstltree.demo.ss_job), after the query has finished.

- state: the query's final state read back with Spark's ``statestore`` data source
  (through the checkpoint file manager, so from the tree) as the demo's stats lists;
- verdicts: that state and the sink's latest row per plane against the Spark SQL
  batch answer (dstltree.demo.checks), key by key;
- the checkpoint location (a folder, or a ``dstl://`` location read through the
  bridge): batches committed, files in it, state files left in it as plain files;
- the tree: objects written, and orphans / missing objects as ``dstl inspect`` finds
  them (the bridges' newest manifests, structured_streaming/inventory.py);
- the query's progress events: batch durations and trigger intervals.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstltree.demo.checks import BatchStats, SinkSummary, mismatched, sort_keys
from dstltree.demo.flights import Stats
from dstltree.demo.report import _ms
from dstltree.demo.state_reader import state_rows
from dstltree.storage.store import ObjectStore
from dstltree.structured_streaming.configure import TREE_SCHEME

if TYPE_CHECKING:
    from dstltree.structured_streaming.client import BridgeReader

#: suffixes of the files a state store writes per partition and version
STATE_SUFFIXES = (".changelog", ".delta", ".snapshot", ".zip", ".sst")
#: (count, sum dep_delay, sum arr_delay, sum distance, max struct): the buffer's fields
BUFFER_FIELDS = 5


def state_stats(spark: Any, checkpoint: str) -> dict[Any, Stats]:
    """tailnum -> stats list (``[flights, dep_delay_sum, arr_delay_sum, distance_sum,
    last_time, last_origin, last_dest]``) of the aggregation's state at the latest
    committed batch of the query checkpointed at ``checkpoint``, read with
    ``spark.read.format("statestore")``, on Spark 3.5 through the state store provider
    (:func:`dstltree.demo.state_reader.state_rows`; the aggregation buffer: count, three sums with
    null for no value, the max struct). ``spark`` must be configured for the tree.
    Raises ValueError for a state row of another shape, or what Spark raises."""
    out: dict[Any, Stats] = {}
    for key, value in state_rows(spark, checkpoint):
        if len(value) != BUFFER_FIELDS:
            raise ValueError(f"state value of {len(value)} fields, expected {BUFFER_FIELDS}")
        flights, dep, arr, dist, last = value
        out[key[0]] = [flights, dep or 0, arr or 0, dist or 0, *last]
    return out


def verdicts(batch: BatchStats, sink: SinkSummary, state: dict[Any, Stats]) -> dict[str, Any]:
    """The report's verdicts, as the default engine's (dstltree.demo.checks.compare,
    without its route map, which this query does not keep): ``state_matches_batch``,
    ``sink_matches_batch`` (every plane's latest row equals the batch, no duplicate
    (tailnum, flights) row), ``sink_rows``, ``sink_duplicate_rows``,
    ``mismatched_keys`` (at most 50, None first), ``keys``."""
    state_bad = set(mismatched(state, batch.stats))
    sink_bad = set(mismatched(sink.latest, batch.stats))
    return {
        "state_matches_batch": not state_bad,
        "sink_matches_batch": not sink_bad and sink.duplicate_rows == 0,
        "sink_rows": sink.rows,
        "sink_duplicate_rows": sink.duplicate_rows,
        "mismatched_keys": sort_keys(state_bad | sink_bad)[:50],
        "keys": len(batch.stats),
    }


class CheckpointLocation:
    """A query's checkpoint location as the checks see it: a folder (``url`` a local
    path) or a ``dstl://<query>/`` location, which exists in the tree alone and is
    read through the bridge on ``socket`` (dstltree.structured_streaming.client)."""

    def __init__(self, url: str | Path, socket: Path | str | None = None) -> None:
        self.url = str(url).rstrip("/")  # of a dstl:// location, the bridge's query root
        self.socket = socket
        self._reader: BridgeReader | None = None
        if self.in_tree and socket is None:
            raise ValueError(f"{self.url}: a dstl:// location is read through a bridge socket")

    @property
    def in_tree(self) -> bool:
        """Whether the location is a ``dstl://`` one (no plain file of it exists)."""
        return self.url.startswith(TREE_SCHEME + "://")

    def _bridge(self) -> BridgeReader:
        """One connection to the bridge for every look (the demo polls the logs every
        few milliseconds); closed by :meth:`close`."""
        from dstltree.structured_streaming.client import BridgeReader

        if self._reader is None:
            assert self.socket is not None
            self._reader = BridgeReader(self.socket)
        return self._reader

    def close(self) -> None:
        """Close the connection to the bridge, if one is open."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def files(self) -> dict[str, int]:
        """Every file of the location: {path relative to it: length in bytes}. A
        folder's files are on the file system (Spark's ``.crc`` files included); a
        ``dstl://`` location's are its view on the bridge. Raises OSError or
        BridgeRequestError."""
        if not self.in_tree:
            top = Path(self.url)
            found = (p for p in top.rglob("*") if p.is_file())
            return {str(p.relative_to(top)): p.stat().st_size for p in found}
        return dict(self._bridge().walk(self.url))

    def batch_ids(self, log: str) -> list[int]:
        """The batch ids of metadata log ``log`` (``offsets``, ``commits``): its file
        names that are numbers. Raises OSError or BridgeRequestError."""
        if not self.in_tree:
            folder = Path(self.url) / log
            names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        else:
            names = list(self._bridge().listing(self.url, log)[0])
        return [int(n) for n in names if n.isdigit()]


def _location(checkpoint: CheckpointLocation | str | Path) -> CheckpointLocation:
    return (
        checkpoint if isinstance(checkpoint, CheckpointLocation) else CheckpointLocation(checkpoint)
    )


def committed_batches(checkpoint: CheckpointLocation | str | Path) -> int:
    """Batches committed by the query: the highest ``commits/<N>`` + 1 (0 for none)."""
    return max(_location(checkpoint).batch_ids("commits"), default=-1) + 1


def planned_batches(checkpoint: CheckpointLocation | str | Path) -> int:
    """Batches whose offsets are written: the highest ``offsets/<N>`` + 1."""
    return max(_location(checkpoint).batch_ids("offsets"), default=-1) + 1


def checkpoint_figures(checkpoint: CheckpointLocation | str | Path) -> dict[str, Any]:
    """Of the query's checkpoint location now: ``location`` (its URL),
    ``batches_completed``, ``checkpoint_files`` (every file of it, Spark's ``.crc``
    files included; of a ``dstl://`` location, the files its view holds),
    ``checkpoint_files_per_batch`` (that / batches, rounded to 0.01; the metadata logs
    keep only the latest ``minBatchesToRetain`` batches, so it is what stays, not all
    that was ever written), ``plain_files`` (files on a file system: 0 for ``dstl://``),
    ``state_files`` suffix -> count of per-partition state files left as plain files
    (``.changelog``/``.delta`` must be 0; RocksDB's ``.sst`` files bypass the manager,
    jvm/README.md; a ``dstl://`` location has none: every file is in the tree),
    ``state_files_ok`` (no ``.changelog`` nor ``.delta`` plain file)."""
    loc = _location(checkpoint)
    files = loc.files()
    batches = committed_batches(loc)
    state = {s: 0 for s in STATE_SUFFIXES}
    for name in [] if loc.in_tree else files:
        for s in STATE_SUFFIXES:
            if name.endswith(s):
                state[s] += 1
    return {
        "location": loc.url,
        "batches_completed": batches,
        "checkpoint_files": len(files),
        "checkpoint_files_per_batch": round(len(files) / batches, 2) if batches else None,
        "plain_files": 0 if loc.in_tree else len(files),
        "state_files": state,
        "state_files_ok": state[".changelog"] == 0 and state[".delta"] == 0,
    }


def tree_figures(tree_base: str, batches: int) -> dict[str, Any]:
    """The tree below ``tree_base`` after the bridge stopped (its last manifests
    written), judged as ``dstl inspect`` judges a base path: ``objects_written``
    (objects present: those the bridge released are gone), ``objects_per_batch``,
    ``orphans`` (present, referenced by no query's newest manifest nor by a retained
    checkpoint), ``missing`` (referenced, absent), ``orphan_paths`` (the first 20) and
    ``ss_queries`` (the checkpoint roots with a manifest), ``manifests_written`` (over
    the roots' lives: each bridge's newest ``seq`` + 1) and ``manifests_per_batch``.
    Raises StorageError."""
    from dstltree.coordinator.cleanup import list_data_files, normalize
    from dstltree.structured_streaming.inventory import manifest_objects, newest_manifests

    store = ObjectStore(tree_base)
    manifests = newest_manifests(store)
    referenced = {normalize(store, u) for doc in manifests for u in manifest_objects(doc)}
    present = set(list_data_files(store))
    orphans = sorted(present - referenced)
    return {
        "objects_written": len(present),
        "objects_per_batch": round(len(present) / batches, 3) if batches else None,
        "orphans": len(orphans),
        "orphan_paths": orphans[:20],
        "missing": len(referenced - present),
        "manifests_written": (written := sum(int(doc.get("seq", 0)) + 1 for doc in manifests)),
        "manifests_per_batch": round(written / batches, 3) if batches else None,
        "ss_queries": [doc.get("root") for doc in manifests],
    }


def read_progress(paths: Iterable[Path]) -> list[list[dict[str, Any]]]:
    """The progress events of each run (one file per process, in run order); a line
    cut short by a kill is skipped."""
    runs = []
    for path in paths:
        events = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        runs.append(events)
    return runs


def progress_figures(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Batch figures from the progress events of each run, in ms rounded to 0.1:
    ``batch_duration_ms`` p50/p99 (``durationMs.triggerExecution`` of every executed
    batch), ``batch_interval_ms`` p50/p99 (trigger start to trigger start of
    consecutive batches of one query run with the interval trigger), ``batches_run``
    (executed batches, a batch replayed after the kill counted twice) and
    ``input_rows`` (their ``numInputRows``, likewise)."""
    durations = [float(e["durationMs"]["triggerExecution"]) for run in runs for e in run]
    intervals: list[float] = []
    for run in runs:
        prev: tuple[str, float] | None = None
        for e in run:
            if e.get("trigger") != "interval":
                prev = None
                continue
            at = _epoch_ms(e["timestamp"])
            if prev is not None and prev[0] == e["runId"]:
                intervals.append(at - prev[1])
            prev = (e["runId"], at)
    return {
        "batch_duration_ms": {"p50": _ms(durations, 50), "p99": _ms(durations, 99)},
        "batch_interval_ms": {"p50": _ms(intervals, 50), "p99": _ms(intervals, 99)},
        "batches_run": len(durations),
        "input_rows": sum(int(e.get("numInputRows", 0)) for run in runs for e in run),
    }


def _epoch_ms(timestamp: str) -> float:
    """Milliseconds since the epoch of a progress event's ISO-8601 ``timestamp``."""
    return datetime.datetime.fromisoformat(timestamp).timestamp() * 1000
