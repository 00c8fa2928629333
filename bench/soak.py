"""The soak benchmark (``dstl bench soak``): node processes in deploy/local.yaml's shape
(7 nodes, a DAG) serve steady writers for N minutes while one node a minute, the root
included, is stopped (SIGTERM or SIGKILL, seeded) and started again with the same id
and endpoint. Each minute every node process and every task process is sampled (RSS,
open file descriptors, threads: psutil), with the objects in the store and the
persist latencies of that minute; at the end, whether each process stayed flat.

Writers, not a keyed job. What a node keeps over months depends on the traffic it
serves (persist requests, acknowledgements, reconnections after a peer's restart,
objects written), not on what produced it: writers make the same traffic at a fixed,
modest rate. A keyed job on Spark would need a JVM and the task runtime on the same two
cores, would set the rate by its own throughput and would mix its own growth into the
figures; the task processes here are only what a node's clients cost.

The workload: ``tasks`` task processes (``spawn``, like executors), each running
``writers_per_task`` writer threads with a client of their own (as each task of a job
has); writer ``i`` uses node ``i mod 7`` first, then the next one (failover). Every
``interval`` seconds each writer appends ``changes`` changes of ``change_bytes`` bytes
and persists for checkpoint ``k`` (the same ``k`` at every writer, from one start
time): ``persist_durably(m)`` from its latest materialization SQN ``m``, so its handle
names every segment since then, as a task's does. Every ``materialize_every``
checkpoints a writer materializes: it truncates its changelog below the end of its
latest handle (no snapshot file is written; the state itself is not what is measured).

The coordinator's part runs in the benchmark's process, on the project's own shared
state registry (coordinator/registry.py): a checkpoint every writer acknowledged is
registered as a :class:`~dstltree.coordinator.checkpoint.CompletedCheckpoint`; beyond
``retained`` checkpoints the oldest is released and the objects whose count dropped to
zero are deleted (checkpoints a writer failed or skipped are aborted). Every
``sweep_every`` seconds unreferenced files modified before the latest completed
checkpoint's trigger minus ``grace`` are deleted, as the coordinator's in-run sweep
does (coordinator/sweep.py; files named by pending acknowledgements are spared). After
the run the nodes are stopped, the files no retained checkpoint references are deleted
(the final sweep) and counted again: the orphans, 0 expected.

One node, ``witness`` (default ``a``, below the root, first parent of two leaves and
second parent of the other two), is never restarted: with a restart a minute among 7
nodes few node processes would live long enough to show a leak, so one lives the whole
run beside the restarted ones. The task processes are never restarted either.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import statistics
import subprocess
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any, TypeVar

import psutil
import yaml

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.bench.chaos import DAG
from dstltree.bench.hotpath import markdown_table
from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.coordinator.checkpoint import CompletedCheckpoint, TaskCheckpoint
from dstltree.coordinator.cleanup import list_data_info, scan_orphans
from dstltree.coordinator.registry import SharedStateRegistry
from dstltree.security.curve import Curve
from dstltree.storage.store import is_reservation
from dstltree.topology.config import load_topology

__all__ = [
    "HEADERS",
    "MinuteRow",
    "ProcSample",
    "SoakReport",
    "SoakSettings",
    "Verdict",
    "markdown_section",
    "minute_cells",
    "run_soak",
    "task_main",
]

KEY_GROUPS = 4  # key groups per writer
PERSIST_TIMEOUT_S = 60.0  # a persist not durable by then counts as failed
FLAT = 0.10  # a metric within 10 % of its baseline is flat
#: one writer's report: (checkpoint, writer, seconds to durable, handle, error text)
Report = tuple[int, int, float | None, ChangelogHandle | None, str | None]
T = TypeVar("T")


@dataclass(frozen=True)
class SoakSettings:
    """``minutes`` of ``minute_s`` seconds (60; shorter in tests); ``tasks`` processes of
    ``writers_per_task`` writers, each persisting ``changes`` changes of
    ``change_bytes`` bytes every ``interval`` seconds and materializing every
    ``materialize_every`` checkpoints; ``retained`` completed checkpoints kept; an
    in-run sweep every ``sweep_every`` seconds sparing ``grace`` seconds; ``witness``:
    the node never restarted (None: every node may be); ``seed``: the restart schedule;
    writers wait ``ack_timeout`` seconds for a node's ack before writing to the DFS
    themselves and go back to their own node after ``hold_down`` seconds up. Raises
    ValueError naming the first field out of range."""

    minutes: int = 30
    minute_s: float = 60.0
    tasks: int = 4
    writers_per_task: int = 4
    interval: float = 0.3
    changes: int = 4
    change_bytes: int = 1024
    materialize_every: int = 10
    retained: int = 2
    sweep_every: float = 10.0
    grace: float = 5.0
    witness: str | None = "a"
    seed: int = 7
    ack_timeout: float = 10.0
    hold_down: float = 5.0

    def __post_init__(self) -> None:
        for name in ("minutes", "tasks", "writers_per_task", "changes", "retained"):
            if getattr(self, name) < 1:
                raise ValueError(f"soak: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("minute_s", "interval", "ack_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"soak: {name} must be > 0 seconds, got {getattr(self, name)}")
        if self.change_bytes < 32 or self.materialize_every < 1:
            raise ValueError("soak: change_bytes must be >= 32 and materialize_every >= 1")
        if self.sweep_every < 0 or self.grace < 0 or self.hold_down < 0:
            raise ValueError("soak: sweep_every, grace and hold_down must be >= 0 seconds")
        if self.witness is not None and self.witness not in DAG:
            raise ValueError(f"soak: witness {self.witness!r} is not a node of {sorted(DAG)}")

    @property
    def writers(self) -> int:
        return self.tasks * self.writers_per_task


# -- the task processes ---------------------------------------------------------------


@dataclass(frozen=True)
class _TaskConfig:
    """One task process: ``writers`` as (writer index, node endpoints in order)."""

    index: int
    base_path: str
    writers: tuple[tuple[int, tuple[str, ...]], ...]
    settings: SoakSettings
    security: Curve | None


class _Outbox:
    """Reports of the writer threads, taken in batches by the task's main thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Report] = []

    def put(self, item: Report) -> None:
        with self._lock:
            self._items.append(item)

    def take(self) -> list[Report]:
        with self._lock:
            out, self._items = self._items, []
        return out


class _SoakWriter(threading.Thread):
    """Persists for checkpoint k at ``start_at + k * interval`` (monotonic seconds, the
    same at every writer), skipping the checkpoints it is too late for."""

    def __init__(self, index: int, client: ChangelogClient, s: SoakSettings, out: _Outbox):
        super().__init__(name=f"soak-writer-{index}", daemon=True)
        self.index, self.s, self.out = index, s, out
        lo = index * KEY_GROUPS
        self.writer = client.create_writer(f"w{index}", range(lo, lo + KEY_GROUPS))
        self.halt = threading.Event()
        self.start_at = 0.0
        self.pad = b"." * (s.change_bytes - 24)

    def run(self) -> None:
        s, k, after, mat_k = self.s, 0, 0, 0
        while True:
            k = max(k + 1, int((time.monotonic() - self.start_at) / s.interval) + 1)
            if self.halt.wait(max(0.0, self.start_at + k * s.interval - time.monotonic())):
                return
            for j in range(s.changes):
                change = f"w{self.index}-cp{k}-{j}:".encode()[:24].ljust(24) + self.pad
                self.writer.append(self.index * KEY_GROUPS + j % KEY_GROUPS, change)
            t0 = time.perf_counter()
            try:
                handle = self.writer.persist_durably(after, checkpoint_id=k).result(
                    PERSIST_TIMEOUT_S
                )
            except Exception as e:  # noqa: BLE001 - reported; the next persist retries
                self.out.put((k, self.index, None, None, f"{type(e).__name__}: {e}"))
                continue
            self.out.put((k, self.index, time.perf_counter() - t0, handle, None))
            if k - mat_k >= s.materialize_every:  # materialized: the log before is dropped
                after, mat_k = handle.sqn_range[1], k
                self.writer.truncate(after)


def task_main(cfg: _TaskConfig, conn: Connection, stop: MpEvent) -> None:
    """A task process: open one client per writer, answer ``("ready", index)``, wait for
    ``("go", start)`` (monotonic seconds of checkpoint 0), then send the writers'
    reports every 0.5 s as ``("reports", index, [Report])`` until ``stop`` is set;
    then stop the writers, close the clients, send the last reports and
    ``("stopped", index)``. A failure to start is sent as ``("error", index, text)``."""
    s, out = cfg.settings, _Outbox()
    clients: list[ChangelogClient] = []
    writers: list[_SoakWriter] = []
    try:
        for index, nodes in cfg.writers:
            client = ChangelogClient.open(
                cfg.base_path,
                node=list(nodes),
                ack_timeout=s.ack_timeout,
                security=cfg.security,
                hold_down=s.hold_down,
            )
            clients.append(client)
            writers.append(_SoakWriter(index, client, s, out))
    except Exception:  # noqa: BLE001 - reported to the benchmark
        conn.send(("error", cfg.index, traceback.format_exc()))
        return
    conn.send(("ready", cfg.index))
    if conn.poll(300):
        _, start = conn.recv()
        for w in writers:
            w.start_at = start
            w.start()
        while not stop.wait(0.5):
            conn.send(("reports", cfg.index, out.take()))
    for w in writers:
        w.halt.set()
    for w in writers:
        if w.is_alive():
            w.join(timeout=PERSIST_TIMEOUT_S + 30)
    for c in clients:
        c.close()
    conn.send(("reports", cfg.index, out.take()))
    conn.send(("stopped", cfg.index))


@dataclass
class _Task:
    index: int
    process: SpawnProcess
    conn: Connection


def _start_tasks(
    ctx: SpawnContext, tree: LocalTree, s: SoakSettings, base_path: str, stop: MpEvent
) -> list[_Task]:
    """Start the task processes and wait (at most 300 s) until each is ready. Raises
    RuntimeError naming a task that failed or did not get ready."""
    order = tree.tree.nodes
    tasks: list[_Task] = []
    for t in range(s.tasks):
        writers = []
        for i in range(t * s.writers_per_task, (t + 1) * s.writers_per_task):
            own, nxt = order[i % len(order)], order[(i + 1) % len(order)]
            writers.append((i, (tree.address(own), tree.address(nxt))))
        cfg = _TaskConfig(t, base_path, tuple(writers), s, tree.client_security)
        parent, child = ctx.Pipe()
        p = ctx.Process(target=task_main, args=(cfg, child, stop), name=f"soak-task-{t}")
        p.daemon = True
        p.start()
        child.close()
        tasks.append(_Task(t, p, parent))
    for task in tasks:
        try:
            msg = task.conn.recv() if task.conn.poll(300) else ("error", "no answer in 300 s")
        except EOFError:
            msg = ("error", f"exited with code {task.process.exitcode}")
        if msg[0] != "ready":
            raise RuntimeError(f"soak: task {task.index} did not start: {msg[-1]}")
    return tasks


def _stop_tasks(tasks: list[_Task], timeout: float) -> None:
    """Join the task processes (they were told to stop); kill those still running
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    for t in tasks:
        t.process.join(timeout=max(0.1, deadline - time.monotonic()))
        if t.process.is_alive():
            t.process.kill()
            t.process.join(timeout=10)


# -- the coordinator's part -------------------------------------------------------------


@dataclass
class _Minute:
    """What the coordinator counted since the last minute was taken."""

    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    completed: int = 0
    deleted: int = 0


def _retry(fn: Callable[[], T], tries: int = 3) -> T:
    """``fn()``, again up to ``tries`` times when a listing meets a file that vanished
    (a node renaming a temporary file, a delete)."""
    for n in range(tries):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - the listing raced a rename; list again
            if n == tries - 1:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


class _Coordinator(threading.Thread):
    """Receives the tasks' reports; registers completed checkpoints, releases those past
    retention and deletes what the registry frees; sweeps unreferenced files in-run."""

    def __init__(self, store: ObjectStore, tasks: list[_Task], s: SoakSettings) -> None:
        super().__init__(name="soak-coordinator", daemon=True)
        self.store, self.s = store, s
        self.conns = {t.conn: t.index for t in tasks}
        self.registry = SharedStateRegistry()
        self.retained: deque[CompletedCheckpoint] = deque()
        self.pending: dict[int, dict[int, ChangelogHandle]] = {}
        self.dead: set[int] = set()  # checkpoints a writer failed
        self.latest = 0
        self.completed = self.aborted = self.deleted = self.swept = 0
        self.errors: list[str] = []
        self.minute = _Minute()
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.start_mono = self.start_wall = 0.0
        self._sweep_due = 0.0

    def go(self, tasks: list[_Task]) -> None:
        """Fix checkpoint 0 at now + 1 s, tell every task, start receiving."""
        self.start_mono, self.start_wall = time.monotonic() + 1.0, time.time() + 1.0
        self._sweep_due = self.start_mono + self.s.sweep_every
        for t in tasks:
            t.conn.send(("go", self.start_mono))
        self.start()

    def run(self) -> None:
        try:
            while self.conns and not self.halt.is_set():
                for c in wait(list(self.conns), timeout=0.5):
                    assert isinstance(c, Connection)
                    self._receive(c)
                if time.monotonic() >= self._sweep_due:
                    self._sweep_due = time.monotonic() + self.s.sweep_every
                    self._sweep()
        except BaseException as e:  # noqa: BLE001 - reported by run_soak
            self.error = e

    def _receive(self, c: Connection) -> None:
        try:
            msg = c.recv()
        except EOFError:
            del self.conns[c]
            return
        if msg[0] == "reports":
            with self.lock:
                for r in msg[2]:
                    self._report(*r)
        elif msg[0] == "stopped":
            del self.conns[c]

    def _report(
        self, k: int, w: int, lat: float | None, h: ChangelogHandle | None, err: str | None
    ) -> None:
        if h is None or lat is None:
            self.minute.failed += 1
            if len(self.errors) < 5:
                self.errors.append(f"checkpoint {k}, writer {w}: {err}")
            self.dead.add(k)
            self.pending.pop(k, None)
            return
        self.minute.latencies.append(lat)
        if k <= self.latest or k in self.dead:
            return  # aborted: it can complete no more
        got = self.pending.setdefault(k, {})
        got[w] = h
        if len(got) == self.s.writers:
            self._complete(k)
        while len(self.pending) > 1000:  # never completes (a stuck writer): bounded
            del self.pending[min(self.pending)]

    def _complete(self, k: int) -> None:
        got = self.pending.pop(k)
        for old in [i for i in self.pending if i < k]:
            del self.pending[old]
        self.dead = {d for d in self.dead if d > k}
        self.aborted += k - self.latest - 1
        tasks = {
            w: TaskCheckpoint(
                w, 0, changelog=(h,), key_groups=(w * KEY_GROUPS, (w + 1) * KEY_GROUPS)
            )
            for w, h in got.items()
        }
        now = time.time()
        trigger = self.start_wall + k * self.s.interval
        cp = CompletedCheckpoint(
            k, 0, 0, now, now - trigger, tasks, len(tasks), len(tasks) * KEY_GROUPS
        )
        self.registry.register(cp)
        self.retained.append(cp)
        self.latest = k
        self.completed += 1
        self.minute.completed += 1
        while len(self.retained) > self.s.retained:
            self._delete_objects(self.registry.unregister(self.retained.popleft()))

    def _delete_objects(self, urls: Iterable[str]) -> None:
        n = len(self.store.delete(list(urls)))
        self.deleted += n
        self.minute.deleted += n

    def _sweep(self) -> None:
        """Delete unreferenced files older than the latest completed trigger - grace."""
        with self.lock:
            if self.latest == 0:
                return
            keep = set(self.registry.referenced())
            for got in self.pending.values():
                for h in got.values():
                    keep |= h.object_paths()
            cutoff = self.start_wall + self.latest * self.s.interval - self.s.grace
            found = _retry(lambda: scan_orphans(self.store, keep, cutoff).orphans)
            self._delete_objects(found)
            self.swept += len(found)

    def take_minute(self) -> tuple[_Minute, int, int]:
        """The minute's figures (then reset), the objects in the store and how many of
        them are reservations (object files created ahead, not written yet)."""
        with self.lock:
            m, self.minute = self.minute, _Minute()
            infos = _retry(lambda: list_data_info(self.store))
        return m, len(infos), sum(1 for i in infos if is_reservation(i))


# -- sampling and the minutes -----------------------------------------------------------


@dataclass(frozen=True)
class ProcSample:
    """One process at the end of a minute: ``role`` node or task, ``name`` (node id or
    ``task<i>``), resident set (MiB), open file descriptors, threads, CPU seconds
    (user + system) since it started."""

    role: str
    name: str
    pid: int
    rss_mib: float
    fds: int
    threads: int
    cpu_s: float


def _sample(role: str, name: str, pid: int) -> ProcSample:
    """Raises psutil.NoSuchProcess when the process is gone."""
    p = psutil.Process(pid)
    with p.oneshot():
        cpu = p.cpu_times()
        return ProcSample(
            role,
            name,
            pid,
            p.memory_info().rss / 2**20,
            p.num_fds(),
            p.num_threads(),
            cpu.user + cpu.system,
        )


@dataclass
class MinuteRow:
    """One minute: every process sampled at its end; the store's files (``reserved``:
    reservations, object files created ahead and not written yet); persists that
    became durable in it with their p50 / p99 (ms) and those that failed; checkpoints
    completed; objects deleted (registry and sweep); restarts so far and this
    minute's (``restarted``: node and signal); ``crashes``: nodes found dead that the
    soak had not stopped (started again)."""

    minute: int
    processes: list[ProcSample]
    objects: int
    reserved: int
    persists: int
    p50_ms: float
    p99_ms: float
    persists_failed: int
    completed: int
    deleted: int
    restarts: int
    restarted: str
    crashes: int


def _restart(tree: LocalTree, node: str, sig: str) -> None:
    """Stop ``node`` with ``sig`` (SIGTERM: SIGKILL after 10 s) and start it again with
    the same id, endpoint and parents."""
    h = tree.nodes[node]
    if sig == "SIGTERM" and h.process.poll() is None:
        h.process.terminate()
        try:
            h.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            h.kill()
    else:
        h.kill()
    tree.start_node(node, h.address)


def _revive(tree: LocalTree) -> int:
    """Start again every node that died without being stopped; how many."""
    dead = [n for n, h in tree.nodes.items() if h.process.poll() is not None]
    for n in dead:
        tree.start_node(n, tree.nodes[n].address)
    return len(dead)


def _sleep_until(t: float, coord: _Coordinator, tasks: list[_Task]) -> None:
    """Sleep until monotonic ``t``; raises RuntimeError when the coordinator failed or a
    task process died meanwhile."""
    while (left := t - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
        if coord.error is not None:
            raise RuntimeError(f"soak coordinator: {coord.error!r}") from coord.error
        for task in tasks:
            if not task.process.is_alive():
                raise RuntimeError(f"soak: task process {task.index} died")


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def _minute_row(
    m: int, tree: LocalTree, tasks: list[_Task], coord: _Coordinator, restarts: tuple[int, str, int]
) -> MinuteRow:
    """Sample every process and take the coordinator's figures for minute ``m``;
    ``restarts``: (so far, this minute's, crashes this minute)."""
    procs = [_sample("node", n, h.pid) for n, h in sorted(tree.nodes.items())]
    procs += [_sample("task", f"task{t.index}", t.process.pid or 0) for t in tasks]
    fig, objects, reserved = coord.take_minute()
    lat = fig.latencies
    return MinuteRow(
        m,
        procs,
        objects,
        reserved,
        len(lat),
        statistics.median(lat) * 1e3 if lat else 0.0,
        _percentile(lat, 0.99) * 1e3,
        fig.failed,
        fig.completed,
        fig.deleted,
        *restarts,
    )


def _minutes(
    tree: LocalTree,
    tasks: list[_Task],
    coord: _Coordinator,
    s: SoakSettings,
    report: SoakReport,
    progress: Callable[[MinuteRow], None] | None,
) -> None:
    """The run: each minute one node restarted at a random moment of its middle half
    (SIGTERM or SIGKILL, seeded), then every process sampled at its end."""
    rng = random.Random(s.seed)
    victims = sorted(n for n in tree.nodes if n != s.witness)
    for m in range(1, s.minutes + 1):
        begin = coord.start_mono + (m - 1) * s.minute_s
        _sleep_until(begin + rng.uniform(0.25, 0.75) * s.minute_s, coord, tasks)
        node, sig = rng.choice(victims), rng.choice(("SIGTERM", "SIGKILL"))
        _restart(tree, node, sig)
        report.restarts += 1
        report.root_restarts += node == tree.tree.root
        _sleep_until(begin + s.minute_s, coord, tasks)
        crashes = _revive(tree)
        report.crashes += crashes
        row = _minute_row(m, tree, tasks, coord, (report.restarts, f"{node} ({sig})", crashes))
        report.minutes.append(row)
        if progress is not None:
            progress(row)


def run_soak(
    s: SoakSettings,
    workdir: str | None = None,
    progress: Callable[[MinuteRow], None] | None = None,
) -> SoakReport:
    """The soak (see the module docstring) in a temporary directory under ``workdir``
    (default TMPDIR), removed afterwards; ``progress`` gets each minute's row. Raises
    RuntimeError when a task process or the coordinator's thread failed."""
    with tempfile.TemporaryDirectory(prefix="dstl-soak-", dir=workdir) as root:
        wd = Path(root)
        path = _topology(wd)
        base = str(wd / "dfs")
        report = SoakReport(s)
        tree = start_tree(load_topology(path), path, workdir=wd)
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        tasks: list[_Task] = []
        coord: _Coordinator | None = None
        try:
            tasks = _start_tasks(ctx, tree, s, base, stop)
            coord = _Coordinator(ObjectStore(base), tasks, s)
            coord.go(tasks)
            _minutes(tree, tasks, coord, s, report, progress)
            stop.set()
            coord.join(timeout=PERSIST_TIMEOUT_S + 60)
        finally:
            stop.set()
            _stop_tasks(tasks, PERSIST_TIMEOUT_S + 60)
            if coord is not None:
                coord.halt.set()
                coord.join(timeout=30)
            tree.stop()
        _finish(coord, report)
        return report


def _topology(workdir: Path) -> Path:
    """deploy/local.yaml's tree (persist delay 50 ms, target 4 MiB, parent timeout 2 s)
    with its store under ``workdir``."""
    nodes = [{"id": n, "bind": "auto", **({"parents": p} if p else {})} for n, p in DAG.items()]
    doc = {
        "base_path": str(workdir / "dfs"),
        "target_object_bytes": "4MiB",
        "persist_delay": 0.05,
        "parent_timeout": 2.0,
        "plan_window": 16,
        "nodes": nodes,
    }
    path = workdir / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _finish(coord: _Coordinator, report: SoakReport) -> None:
    """After the nodes stopped: the coordinator's totals, every retained checkpoint's
    objects checked present, the final sweep and the orphans counted again."""
    if coord.error is not None:
        raise RuntimeError(f"soak coordinator: {coord.error!r}") from coord.error
    store = coord.store
    report.completed, report.aborted = coord.completed, coord.aborted
    report.deleted, report.swept, report.errors = coord.deleted, coord.swept, coord.errors
    referenced = coord.registry.referenced()
    report.retained_objects = len(referenced)
    report.missing_objects = sum(not store.exists(p) for p in referenced)
    found = scan_orphans(store, referenced).orphans
    reserved = {i.url for i in list_data_info(store) if is_reservation(i)}
    report.reserved_found = sum(1 for u in found if u in reserved)
    report.orphans_found = len(found)
    store.delete(found)
    report.orphans_after_sweep = len(scan_orphans(store, referenced).orphans)


# -- the report -------------------------------------------------------------------------

METRICS = (("rss_mib", "RSS MiB"), ("fds", "fds"), ("threads", "threads"))


@dataclass(frozen=True)
class Verdict:
    """One process and metric: its value at the baseline minute and at the last one,
    ``verdict`` "flat" (within 10 %) or the growth; ``restarted``: a node whose process
    at the last minute is not the one of the baseline minute; ``since``: the first
    minute from which the last minute's process held the last value (a step, then
    constant, or still moving: ``since`` is the last minute)."""

    process: str
    metric: str
    base: float
    last: float
    verdict: str
    restarted: bool
    since: int


def verdict_text(base: float, last: float) -> str:
    """ "flat" when ``last`` is within 10 % of ``base``, else the growth in % and in
    the metric's unit."""
    if base <= 0:
        return "flat" if last == base else f"{last - base:+g} (from 0)"
    growth = (last - base) / base
    if abs(growth) <= FLAT:
        return "flat"
    return f"{growth * 100:+.0f} % ({last - base:+.1f})"


@dataclass
class SoakReport:
    """The minutes and the end of a soak: checkpoints completed / aborted, objects
    deleted (registry and sweeps; ``swept``: by the in-run sweeps), objects the retained
    checkpoints reference and those missing (0 expected), the files the final sweep
    found (``reserved_found``: reservations, of killed nodes) and the
    orphans after it (0 expected), the first persist errors."""

    settings: SoakSettings
    minutes: list[MinuteRow] = field(default_factory=list)
    restarts: int = 0
    root_restarts: int = 0
    crashes: int = 0
    completed: int = 0
    aborted: int = 0
    deleted: int = 0
    swept: int = 0
    retained_objects: int = 0
    missing_objects: int = 0
    orphans_found: int = 0
    reserved_found: int = 0
    orphans_after_sweep: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def baseline_minute(self) -> int:
        """Minute 5, or the first full minute (1) for a run shorter than 6 minutes."""
        return 5 if len(self.minutes) >= 6 else 1

    @property
    def persists_failed(self) -> int:
        return sum(r.persists_failed for r in self.minutes)

    def verdicts(self) -> list[Verdict]:
        """Per process of the last minute and metric, against the baseline minute."""
        if not self.minutes:
            return []
        base = {(p.role, p.name): p for p in self.minutes[self.baseline_minute - 1].processes}
        out = []
        for p in self.minutes[-1].processes:
            b = base.get((p.role, p.name))
            if b is None:
                continue
            for attr, label in METRICS:
                bv, lv = float(getattr(b, attr)), float(getattr(p, attr))
                since = self._held_since(p, attr)
                who = f"{p.role} {p.name}"
                out.append(Verdict(who, label, bv, lv, verdict_text(bv, lv), b.pid != p.pid, since))
        return out

    def _held_since(self, last: ProcSample, attr: str) -> int:
        """The first minute from which ``last``'s process held its value of ``attr``."""
        since = len(self.minutes)
        for row in reversed(self.minutes[:-1]):
            same = [p for p in row.processes if p.pid == last.pid and p.name == last.name]
            if not same or getattr(same[0], attr) != getattr(last, attr):
                break
            since = row.minute
        return since

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON-compatible data (every process of every minute)."""
        d = {k: v for k, v in asdict(self).items() if k != "minutes"}
        d["baseline_minute"] = self.baseline_minute
        d["persists_failed"] = self.persists_failed
        d["minutes"] = [
            {**asdict(r), "nodes": _role_figures(r, "node"), "tasks": _role_figures(r, "task")}
            for r in self.minutes
        ]
        d["verdicts"] = [asdict(v) for v in self.verdicts()]
        return d


def _role_figures(r: MinuteRow, role: str) -> dict[str, dict[str, float]]:
    """Max and sum per metric over the processes of ``role``."""
    ps = [p for p in r.processes if p.role == role]
    return {
        attr: {"max": max(getattr(p, attr) for p in ps), "sum": sum(getattr(p, attr) for p in ps)}
        for attr, _ in METRICS
        if ps
    }


HEADERS = (
    "min",
    "node MiB",
    "node fds",
    "node threads",
    "task MiB",
    "task fds",
    "task threads",
    "objects (reserved)",
    "persists",
    "p50 ms",
    "p99 ms",
    "failed",
    "checkpoints",
    "deleted",
    "restarts",
)
#: what the per-role cells of :data:`HEADERS` hold
ROLE_NOTE = "node / task cells: max / sum over the role's processes (RSS in MiB)"


def minute_cells(r: MinuteRow) -> list[str]:
    """One minute as table cells (:data:`HEADERS`)."""
    cells = [str(r.minute)]
    for role in ("node", "task"):
        fig = _role_figures(r, role)
        for attr, _ in METRICS:
            f = fig.get(attr, {"max": 0.0, "sum": 0.0})
            fmt = "{:.1f} / {:.0f}" if attr == "rss_mib" else "{:.0f} / {:.0f}"
            cells.append(fmt.format(f["max"], f["sum"]))
    return cells + [
        f"{r.objects} ({r.reserved})",
        str(r.persists),
        f"{r.p50_ms:.1f}",
        f"{r.p99_ms:.1f}",
        str(r.persists_failed),
        str(r.completed),
        str(r.deleted),
        f"{r.restarts}: {r.restarted}" + (f", {r.crashes} crashed" if r.crashes else ""),
    ]


VERDICT_HEADERS = ("process", *(label for _, label in METRICS))


def verdict_rows(report: SoakReport) -> list[list[str]]:
    """One row per process: per metric "base -> last: verdict" (and, when not flat, the
    minute since which the value held), "(restarted)" when the node's process changed
    since the baseline minute."""
    rows: dict[str, list[str]] = {}
    for v in report.verdicts():
        row = rows.setdefault(v.process, [v.process + (" (restarted)" if v.restarted else "")])
        fmt = "{:.1f} -> {:.1f}: {}" if v.metric == "RSS MiB" else "{:.0f} -> {:.0f}: {}"
        held = f", held since minute {v.since}" if v.verdict != "flat" else ""
        row.append(fmt.format(v.base, v.last, v.verdict) + held)
    return list(rows.values())


def summary_lines(report: SoakReport) -> list[str]:
    """The baseline used, the end figures and the orphans."""
    n, b = len(report.minutes), report.baseline_minute
    basis = (
        f"verdicts: the last minute ({n}) against minute {b}"
        if b == 5
        else f"verdicts: a run shorter than 6 minutes: the last minute ({n}) against the "
        "first full minute (1)"
    )
    return [
        basis + "; flat = within 10 %",
        f"restarts: {report.restarts} ({report.root_restarts} of the root), nodes that "
        f"died on their own: {report.crashes}; persists failed: {report.persists_failed}",
        f"checkpoints completed: {report.completed}, aborted: {report.aborted}; objects "
        f"deleted: {report.deleted} (in-run sweeps: {report.swept}); the retained "
        f"checkpoints reference {report.retained_objects}, missing: {report.missing_objects}",
        f"orphans after the nodes stopped: {report.orphans_found} (reservations: "
        f"{report.reserved_found}), after the sweep: {report.orphans_after_sweep}",
    ]


SECTION = "Soak"

_HOW = """How it is measured (dstltree/bench/soak.py): 7 node processes in
deploy/local.yaml's shape (a DAG, CURVE on, target 4 MiB, persist delay 50 ms, parent
timeout 2 s); 4 task processes (`spawn`) of 4 writer threads, each writer with a client
of its own and two nodes (its own, then the next one's), appending 4 changes of 1 KiB
and persisting for the same checkpoint every 0.3 s from its latest materialization SQN;
every 10 checkpoints a writer materializes (truncates its log; no snapshot file). Writers
rather than a keyed job: a node's resources follow the traffic it serves, which writers
make at a fixed, cheap rate; a job on Spark would add a JVM on the same two cores and its
own growth to the figures. The benchmark's process registers every checkpoint all 16
writers acknowledged in the shared state registry (coordinator/registry.py), keeps 2,
deletes what the released ones alone referenced, and sweeps unreferenced files older
than the latest completed trigger minus 5 s every 10 s (coordinator/sweep.py). Once a
minute, at a random moment of its middle half (seed 7), a random node other than the
witness `a` (the root included) gets SIGTERM or SIGKILL and is started again with the
same id and endpoint; `a` lives the whole run so that one node process is as old as the
run. At each minute's end psutil samples every node and task process (max / sum per
role here, each process in the JSON); persist latencies are `persist_durably` to a
durable handle. After the run the nodes stop, the files no retained checkpoint
references are deleted and counted again (orphans).
"""


def markdown_section(report: SoakReport, meta: dict[str, str], nproc: int) -> str:
    """The ``## Soak`` section of BENCHMARKS.md: command, commit, date, the minutes, the
    verdicts and the end figures."""
    lines = [
        f"## {SECTION}",
        "",
        f"`{meta['command']}` on commit {meta['commit']}, {meta['date']}, `nproc` = {nproc}.",
        "",
        *markdown_table(HEADERS, [minute_cells(r) for r in report.minutes]),
        "",
        ROLE_NOTE + "; checkpoints completed, objects deleted in the minute.",
        "",
        *markdown_table(VERDICT_HEADERS, verdict_rows(report)),
        "",
        *(f"- {line}" for line in summary_lines(report)),
    ]
    return "\n".join(lines) + "\n\n" + _HOW
