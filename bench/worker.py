"""The per-executor process: the writers of one executor, driven over a pipe.

The driver sends ``("cp", k, sizes)``; the process appends ``sizes[j]`` bytes to its
j-th writer, calls ``persist_durably(after, checkpoint_id=k)`` on every writer, waits for
the futures and answers ``("done", k, CheckpointReport)``. ``("stop",)`` closes the
client and answers ``("stopped", ProcessStats)``. Started with the ``spawn`` context,
like a real executor; everything passed is picklable.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES, ChangelogClient
from dstltree.client.direct import DirectUploader
from dstltree.client.handle import ChangelogHandle
from dstltree.client.node_uploader import NodeUploader
from dstltree.client.writer import ChangelogWriter
from dstltree.security.curve import Curve
from dstltree.storage.hedging import HedgedUploader, UploadPolicy
from dstltree.storage.store import ObjectStore
from dstltree.topology.designs import TREE_DESIGNS

__all__ = ["CheckpointReport", "ProcessStats", "WorkerConfig", "worker_main"]

_CHANGE_BYTES = 16 * 1024  # one appended change (the last one of a checkpoint is shorter)
_POOL_BYTES = 1 << 20  # random bytes sliced into changes
_KEY_GROUPS_PER_WRITER = 8
_PERSIST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WorkerConfig:
    """One executor process. ``design``: task, executor, tree or tree-noplan.
    ``base_path``/``storage_options``: where its in-process uploads (or, for tree, its
    fallback writes) go. ``node_address``: its node (tree designs). ``writer_ids``:
    global writer indices. ``attempts``/``upload_timeout`` (s): hedging of in-process
    uploads. ``ack_timeout`` (s): how long a segment may wait for its node.
    ``security``: CURVE to the node (the writer keys of the bench tree), None =
    plaintext."""

    index: int
    node_id: str
    design: str
    base_path: str
    storage_options: dict[str, Any]
    writer_ids: tuple[int, ...]
    node_address: str | None = None
    attempts: int = 3
    upload_timeout: float = 1.0
    ack_timeout: float = 10.0
    executor_persist_delay: float = 0.010
    seed: int = 0
    security: Curve | None = None


@dataclass(frozen=True)
class CheckpointReport:
    """One checkpoint in one executor process: per-writer latency (ms, trigger received
    to handle), ``done_at`` (time.monotonic() of the last handle, system-wide clock),
    the new segments ``(log_id, object path, offset, length)`` and an error text."""

    latencies_ms: tuple[float, ...]
    done_at: float
    segments: tuple[tuple[str, str, int, int], ...]
    error: str | None = None


@dataclass(frozen=True)
class ProcessStats:
    """CPU seconds (user + system) of the process and its DFS upload counters (the
    ``HedgingStats`` fields summed over its uploaders)."""

    cpu_s: float
    uploads: dict[str, int] = field(default_factory=dict)


class _Executor:
    """The clients and writers of one executor process for one design."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.policy = UploadPolicy(attempts=cfg.attempts, upload_timeout=cfg.upload_timeout)
        self.clients: list[ChangelogClient] = []
        self.writers: list[ChangelogWriter] = []
        if cfg.design in TREE_DESIGNS:
            assert cfg.node_address is not None
            client = ChangelogClient.open(
                cfg.base_path,
                node=cfg.node_address,
                storage_options=cfg.storage_options,
                ack_timeout=cfg.ack_timeout,
                security=cfg.security,
            )
            self.store = client.store
            self.clients = [client]
            assert isinstance(client.uploader, NodeUploader)
            self.hedged = client.uploader.fallback.hedged
        else:
            self.store = ObjectStore(cfg.base_path, cfg.storage_options)
            # one hedged uploader for every in-process client of this executor
            self.hedged = HedgedUploader(self.store, self.policy)
            if cfg.design == "task":  # one client (and object) per writer
                self.clients = [self._direct(0.0, 1) for _ in cfg.writer_ids]
            else:  # one client per executor, flushed once all its writers persisted
                self.clients = [self._direct(cfg.executor_persist_delay, 1 << 40)]
        for n, w in enumerate(cfg.writer_ids):
            client = self.clients[n % len(self.clients)]
            lo = w * _KEY_GROUPS_PER_WRITER
            self.writers.append(
                client.create_writer(f"w{w:05d}", range(lo, lo + _KEY_GROUPS_PER_WRITER))
            )
        self.after = [0] * len(self.writers)
        self.pool = os.urandom(_POOL_BYTES)
        self.offset = cfg.seed % _POOL_BYTES

    def _direct(self, delay: float, target: int) -> ChangelogClient:
        uploader = DirectUploader(self.store, delay, target, hedged=self.hedged)
        return ChangelogClient(self.store, uploader, DEFAULT_PREEMPTIVE_BYTES)

    def _change(self, n: int) -> bytes:
        if self.offset + n > _POOL_BYTES:
            self.offset = 0
        out = self.pool[self.offset : self.offset + n]
        self.offset = (self.offset + 4099) % _POOL_BYTES
        return out

    def checkpoint(self, k: int, sizes: list[int]) -> CheckpointReport:
        t0 = time.monotonic()
        for writer, size in zip(self.writers, sizes, strict=True):
            left = size
            kg = writer.key_groups.start
            while left > 0:
                n = min(left, _CHANGE_BYTES)
                writer.append(
                    kg + (left // _CHANGE_BYTES) % _KEY_GROUPS_PER_WRITER, self._change(n)
                )
                left -= n
        futures = [
            w.persist_durably(a, checkpoint_id=k)
            for w, a in zip(self.writers, self.after, strict=True)
        ]
        done_at = [0.0] * len(futures)

        def stamp(i: int) -> Callable[[Future[ChangelogHandle]], None]:
            return lambda _f: done_at.__setitem__(i, time.monotonic())

        for i, f in enumerate(futures):
            f.add_done_callback(stamp(i))
        _, pending = wait(futures, timeout=_PERSIST_TIMEOUT_S)
        if pending:
            return CheckpointReport((), time.monotonic(), (), f"{len(pending)} persists pending")
        segments: list[tuple[str, str, int, int]] = []
        for n, f in enumerate(futures):
            exc = f.exception()
            if exc is not None:
                return CheckpointReport((), time.monotonic(), (), f"persist failed: {exc}")
            handle = f.result()
            old = self.after[n]
            self.after[n] = handle.sqn_range[1]
            for ref in handle.segments:
                if ref.sqn_from >= old:  # new in this checkpoint
                    segments.append((handle.log_id, ref.path, ref.offset, ref.length))
            # the changes are durable: a checkpoint after this one never needs them
            self.writers[n].truncate(self.after[n])
        end = max(done_at) if done_at else time.monotonic()
        return CheckpointReport(tuple((d - t0) * 1000 for d in done_at), end, tuple(segments))

    def stats(self) -> ProcessStats:
        return ProcessStats(sum(os.times()[:2]), self.hedged.stats.snapshot())

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self.hedged.drain(30.0)


def worker_main(conn: Connection, cfg: WorkerConfig) -> None:
    """The process body: build the writers, answer ``("ready", ProcessStats)``, then serve
    checkpoint and stop commands until ``("stop",)`` or the pipe closes."""
    try:
        ex = _Executor(cfg)
    except Exception:  # noqa: BLE001 - reported to the driver
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", ex.stats()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            ex.close()
            return
        if msg[0] == "cp":
            try:
                report = ex.checkpoint(msg[1], msg[2])
            except Exception:  # noqa: BLE001 - reported to the driver
                report = CheckpointReport((), time.monotonic(), (), traceback.format_exc())
            conn.send(("done", msg[1], report))
        elif msg[0] == "stats":
            conn.send(("stats", ex.stats()))
        elif msg[0] == "stop":
            ex.close()
            conn.send(("stopped", ex.stats()))
            return
