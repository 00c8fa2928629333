"""Metrics of one design run (field names of BENCHMARKS.md) and the acceptance checks of the tree.

Bytes are segment bytes (the writers' encoded changesets, without object indexes);
``MB`` is 10**6 bytes, ``GB`` 10**9 bytes; times in milliseconds or seconds as named.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from dstltree.bench.designs import BenchSettings, DesignRun
from dstltree.stats import percentile

__all__ = [
    "JSON_FIELDS",
    "Segment",
    "acceptance",
    "compute_metrics",
    "segments_of",
    "upload_requests",
]

JSON_FIELDS = (
    "objects_per_checkpoint",
    "requests_per_checkpoint",
    "mean_object_bytes",
    "persist_ms_p50",
    "persist_ms_p99",
    "relay_fraction",
    "throughput_mb_s",
    "cpu_s_per_gb",
)


@dataclass(frozen=True)
class Segment:
    """One new segment of checkpoint ``k``: origin executor node, the node (or
    ``x-<node>`` executor process) that wrote its object, object path, length."""

    k: int
    origin: str
    writer: str
    path: str
    length: int


def _writer_of(path: str, base: str) -> str:
    rest = path.split(base.rstrip("/") + "/", 1)[-1]
    return rest.split("/", 1)[0]


def segments_of(run: DesignRun) -> list[Segment]:
    """Every new segment of every checkpoint, attributed to origin and writer."""
    out = []
    for cp in run.checkpoints:
        for e, report in enumerate(cp.reports):
            for _log, path, _off, length in report.segments:
                out.append(
                    Segment(cp.k, run.executor_nodes[e], _writer_of(path, run.base), path, length)
                )
    return out


def _uploads(doc: dict[str, Any]) -> int:
    u = doc.get("uploads", {})
    return int(u.get("attempts", 0)) + int(u.get("retries", 0))


def upload_requests(run: DesignRun) -> tuple[int, int]:
    """DFS upload requests (attempts + retries) and hedged attempts, nodes and executor
    processes together."""
    requests = sum(_uploads(d) for d in run.node_final.values())
    requests += sum(_uploads({"uploads": w.uploads}) for w in run.workers_end)
    hedged = sum(
        int(d.get("uploads", {}).get("hedged_attempts", 0)) for d in run.node_final.values()
    )
    hedged += sum(int(w.uploads.get("hedged_attempts", 0)) for w in run.workers_end)
    return requests, hedged


def _cpu_s(run: DesignRun) -> float:
    """CPU seconds of the executor processes and the nodes during the run."""
    cpu = sum(e.cpu_s - s.cpu_s for s, e in zip(run.workers_start, run.workers_end, strict=False))
    start_nodes = run.node_snapshots.get(0, {})
    cpu += sum(
        float(d.get("process_cpu_s", 0.0)) - float(start_nodes.get(n, {}).get("process_cpu_s", 0.0))
        for n, d in run.node_final.items()
    )
    return cpu


def _per_window(
    run: DesignRun, segs: list[Segment], objects: list[int], window: int, last_w: int
) -> list[dict[str, Any]]:
    """Per plan window: mean objects per checkpoint and the nodes that wrote."""
    has_nodes = bool(run.node_final)
    out = []
    for w in range(last_w + 1):
        objs = [o for cp, o in zip(run.checkpoints, objects, strict=True) if cp.k // window == w]
        writers = sorted({s.writer for s in segs if s.k // window == w})
        out.append(
            {
                "window": w,
                "objects_per_checkpoint": statistics.fmean(objs),
                "writers": writers if has_nodes else [],
            }
        )
    return out


def _relay_after_first_window(run: DesignRun, segs: list[Segment], window: int) -> float:
    """Bytes relayed by nodes after the first plan window over the segment bytes of
    those checkpoints; 0 without nodes, NaN without a snapshot or bytes after it."""
    if not run.node_final:
        return 0.0
    relayed = sum(int(d.get("bytes_relayed", 0)) for d in run.node_final.values())
    first = run.node_snapshots.get(1, {})
    relayed_w0 = sum(int(d.get("bytes_relayed", 0)) for d in first.values())
    bytes_after = sum(s.length for s in segs if s.k >= window)
    return (relayed - relayed_w0) / bytes_after if bytes_after and first else math.nan


def _per_checkpoint(value: float, n_cp: int) -> float:
    """``value`` per checkpoint over ``n_cp`` checkpoints; NaN for none."""
    return value / n_cp if n_cp else math.nan


def compute_metrics(run: DesignRun, settings: BenchSettings) -> dict[str, Any]:
    """The per-design metrics: the JSON fields plus ``persist_ms_p999``, steady-state
    values after the first plan window (``*_after_first_window``), ``max_hops``, the
    writer nodes of the last window and node counters."""
    segs = segments_of(run)
    n_cp = len(run.checkpoints)
    window = settings.plan_window
    paths: dict[int, set[str]] = defaultdict(set)
    for s in segs:
        paths[s.k].add(s.path)
    objects = [len(paths[cp.k]) for cp in run.checkpoints]
    steady = [o for cp, o in zip(run.checkpoints, objects, strict=True) if cp.k >= window]
    total_bytes = sum(s.length for s in segs)
    n_objects = sum(objects)
    persist_ms = [cp.persist_s * 1000 for cp in run.checkpoints]
    requests, hedged = upload_requests(run)
    relayed = sum(int(d.get("bytes_relayed", 0)) for d in run.node_final.values())
    last_w = (n_cp - 1) // window if n_cp else 0
    has_nodes = bool(run.node_final)
    return {
        "objects_per_checkpoint": statistics.fmean(objects) if objects else math.nan,
        "requests_per_checkpoint": _per_checkpoint(requests, n_cp),
        "mean_object_bytes": total_bytes / n_objects if n_objects else math.nan,
        "persist_ms_p50": percentile(persist_ms, 50),
        "persist_ms_p99": percentile(persist_ms, 99),
        "persist_ms_p999": percentile(persist_ms, 99.9),
        "relay_fraction": relayed / total_bytes if total_bytes else 0.0,
        "throughput_mb_s": total_bytes / run.phase_s / 1e6 if run.phase_s else math.nan,
        "cpu_s_per_gb": _cpu_s(run) / (total_bytes / 1e9) if total_bytes else math.nan,
        "objects_per_checkpoint_after_first_window": statistics.fmean(steady)
        if steady
        else math.nan,
        "relay_fraction_after_first_window": _relay_after_first_window(run, segs, window),
        "hedged_attempts_per_checkpoint": _per_checkpoint(hedged, n_cp),
        "checkpoints": n_cp,
        "segment_bytes": total_bytes,
        "objects": n_objects,
        "bytes_per_checkpoint": _per_checkpoint(total_bytes, n_cp),
        "writer_nodes_last_window": sorted({s.writer for s in segs if s.k // window == last_w})
        if has_nodes
        else [],
        "node_bytes_relayed": {
            n: int(d.get("bytes_relayed", 0)) for n, d in run.node_final.items()
        },
        "node_objects_written": {
            n: int(d.get("objects_written", 0)) for n, d in run.node_final.items()
        },
        "windows": _per_window(run, segs, objects, window, last_w),
        "fallback_segments": sum(1 for s in segs if s.writer.startswith("x-")) if has_nodes else 0,
    }


def acceptance(run: DesignRun, settings: BenchSettings, metrics: dict[str, Any]) -> dict[str, Any]:
    """The acceptance checks of a tree run (BENCHMARKS.md), after the first plan window:
    relay fraction <= 5 %, every segment at most one hop from its executor's node (a
    relayed segment took 2+ hops), objects per checkpoint <= ceil(bytes / target) +
    writer nodes of that checkpoint, and mean object >= target / 2 when a checkpoint's
    bytes exceed the target. Lists the failing checkpoints."""
    window = settings.plan_window
    target = settings.target_object_bytes
    by_cp: dict[int, list[Segment]] = defaultdict(list)
    for s in segments_of(run):
        by_cp[s.k].append(s)
    too_many, too_small = [], []
    for k, segs in sorted(by_cp.items()):
        if k < window:
            continue
        nbytes = sum(s.length for s in segs)
        objs = len({s.path for s in segs})
        writers = len({s.writer for s in segs})
        if objs > math.ceil(nbytes / target) + writers:
            too_many.append((k, objs, math.ceil(nbytes / target), writers))
        if nbytes > target and nbytes / objs < target / 2:
            too_small.append((k, round(nbytes / objs)))
    relay = metrics["relay_fraction_after_first_window"]
    relayed_after = relay > 0 if not math.isnan(relay) else True
    return {
        "relay_fraction_after_first_window": relay,
        "relay_ok": (not math.isnan(relay)) and relay <= 0.05,
        "max_hops_after_first_window": "2+" if relayed_after else 1,
        "hops_ok": not relayed_after,
        "objects_bound_violations": too_many,
        "objects_ok": not too_many,
        "mean_object_violations": too_small,
        "mean_object_ok": not too_small,
    }
