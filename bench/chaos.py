"""The chaos benchmark (``dstl bench chaos``): a 7-node topology of node processes under
16 writers while every 1-2 s a random node, the root included, suffers a fault, chosen
at random per event among the ``faults`` of the run:

- ``kills``: killed hard (SIGKILL) and restarted at once with the same id and endpoint;
- ``stops``: stopped (SIGSTOP) for 1-5 s, then continued (SIGCONT): the process keeps
  its sockets and its kernel its TCP connections, so only heartbeats tell a peer (the
  wire's ping/pong, client/liveness.py, answered by the node's loop).

Three cases in one run, each on a fresh tree and store:

- ``dag, no faults``: the DAG (every node below the root names a second parent in the
  other subtree) and writers with two nodes each (their own, then a neighbour's);
- ``dag, <faults>``: the same under the faults;
- ``tree, <faults>``: first parents only and one node per writer, under the same fault
  schedule (the seed fixes it): what a tree without second ways up gives.

Per case: persist latencies (``persist_durably`` to a durable handle, seconds), changes
lost, duplicated or out of order (every writer's acknowledged changes read back through
its last handle), handle objects missing, the writers' direct DFS writes (fallbacks),
failovers and re-sent segments, the stops and how long until the first failover away
from a stopped node (its detection: from the SIGSTOP to the first move of a writer or
a child node away from it, from the writers' failover logs and the nodes' logs of
silent parents, wall-clock times), and the orphans: files no handle references once
the nodes stopped (second copies of re-sent segments, object files reserved by killed
nodes), deleted by the registry's sweep, then counted again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.bench import chaos_net, history
from dstltree.bench.chaos_net import NET_FAULTS
from dstltree.bench.netns import NetHosts
from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES
from dstltree.client.node_uploader import NodeUploader
from dstltree.coordinator.cleanup import list_data_info, scan_orphans
from dstltree.topology.config import load_topology

__all__ = [
    "FAULTS",
    "ChaosResult",
    "ChaosSettings",
    "cases",
    "parse_faults",
    "run_case",
    "run_chaos",
    "TREE",
    "DAG",
]

FAULTS = ("kills", "stops", *NET_FAULTS)  # the kinds of fault, in the order they are named

#: deploy/local.yaml's shape: node id -> parents in order of preference
DAG: dict[str, list[str]] = {
    "root": [],
    "a": ["root"],
    "b": ["root", "a"],
    "a1": ["a", "b"],
    "a2": ["a", "b"],
    "b1": ["b", "a"],
    "b2": ["b", "a"],
}
#: the same nodes with first parents only
TREE: dict[str, list[str]] = {n: p[:1] for n, p in DAG.items()}


def parse_faults(text: str) -> tuple[str, ...]:
    """``"kills,stops"`` as ``("kills", "stops")`` (in FAULTS order, no repeats).
    Raises ValueError naming an unknown fault or an empty list."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(FAULTS))
    if unknown or not names:
        raise ValueError(f"faults: a comma-separated list of {', '.join(FAULTS)}; got {text!r}")
    return tuple(f for f in FAULTS if f in names)


@dataclass(frozen=True)
class ChaosSettings:
    """``seconds`` per case; ``writers`` threads, each persisting ``changes`` changes of
    ``change_bytes`` bytes every ``interval`` seconds; a fault every ``kill_min`` to
    ``kill_max`` seconds (uniform, ``seed``), one of ``faults`` chosen at random per
    event (a stop lasts ``stop_min`` to ``stop_max`` seconds); writers wait
    ``ack_timeout`` seconds for a node's ack before writing to the DFS themselves, and
    go back to their own node after ``hold_down`` seconds up; writers and nodes ping
    every ``ping_interval`` seconds and take a peer silent for ``liveness_timeout``
    seconds as lost (client/liveness.py)."""

    seconds: float = 120.0
    writers: int = 16
    interval: float = 0.2
    changes: int = 3
    change_bytes: int = 1000
    kill_min: float = 1.0
    kill_max: float = 2.0
    seed: int = 7
    ack_timeout: float = 10.0
    hold_down: float = 5.0
    faults: tuple[str, ...] = FAULTS
    stop_min: float = 1.0
    stop_max: float = 5.0
    ping_interval: float = 0.05
    liveness_timeout: float = 0.15
    cut_min: float = 1.0  # seconds a network fault lasts (partitions, oneway)
    cut_max: float = 10.0
    spare_root: bool = False  # faults on nodes below the root only
    overlap: bool = True  # False: a fault only while no other lasts (one at a time)

    @property
    def netns(self) -> bool:
        """Whether the nodes run on hosts of their own (network faults asked for)."""
        return any(f in NET_FAULTS for f in self.faults)


@dataclass
class ChaosResult:
    """One case's figures (latencies and detection times in seconds; ``undetected``:
    stops no writer or child left before the node continued)."""

    case: str
    seconds: float
    kills: int = 0
    root_kills: int = 0
    stops: int = 0
    root_stops: int = 0
    partitions: int = 0
    root_partitions: int = 0
    oneways: int = 0
    oneway_p50_s: float = 0.0  # the median time from a one-way cut to the node's failover
    detect_p50_s: float = 0.0
    detect_max_s: float = 0.0
    undetected: int = 0
    persists: int = 0
    persist_errors: int = 0
    p50_s: float = 0.0
    p99_s: float = 0.0
    max_s: float = 0.0
    changes_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    missing_objects: int = 0
    fallbacks: int = 0
    failovers: int = 0
    resent: int = 0
    orphans_found: int = 0
    reservations_found: int = 0
    orphans_after_sweep: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)
    detections: list[float] = field(default_factory=list, repr=False)

    def figures(self) -> dict[str, Any]:
        """The result without the raw latencies (JSON); detections rounded to ms."""
        d = asdict(self)
        d.pop("latencies")
        d["detections"] = [round(x, 3) for x in self.detections]
        return d


class _Writer(threading.Thread):
    """Persists checkpoint after checkpoint every ``interval`` seconds until stopped;
    ``acked``: the changes covered by its latest acknowledged handle."""

    def __init__(self, index: int, client: ChangelogClient, s: ChaosSettings) -> None:
        super().__init__(name=f"chaos-writer-{index}", daemon=True)
        self.index, self.client, self.s = index, client, s
        self.writer = client.create_writer(f"w{index}", range(4))
        self.stop = threading.Event()
        self.acked: list[tuple[int, bytes]] = []  # (key group, change)
        self.handle: ChangelogHandle | None = None
        self.latencies: list[float] = []
        self.errors = 0

    def run(self) -> None:
        cp, appended, pad = 1, [], b"." * max(0, self.s.change_bytes - 24)
        next_at = time.monotonic()
        while not self.stop.is_set():
            for k in range(self.s.changes):
                change = f"w{self.index}-cp{cp}-{k}:".encode() + pad
                self.writer.append((cp + k) % 4, change)
                appended.append(((cp + k) % 4, change))
            t0 = time.perf_counter()
            try:
                self.handle = self.writer.persist_durably(0, checkpoint_id=cp).result(120)
            except Exception:  # noqa: BLE001 - counted; the next checkpoint covers it
                self.errors += 1
            else:
                self.latencies.append(time.perf_counter() - t0)
                self.acked = list(appended)
            cp += 1
            next_at += self.s.interval
            self.stop.wait(max(0.0, next_at - time.monotonic()))


@dataclass
class _Stop:
    """A fault of ``kind`` (``stops``, ``partitions``, ``oneway``) on ``node`` from
    wall-clock time ``start`` until ``end`` (None: not yet); ``address``: the endpoint
    whose leaving detects it (the node's; for ``oneway`` its parent's)."""

    node: str
    address: str
    start: float
    end: float | None = None
    kind: str = "stops"


class _Chaos(threading.Thread):
    """Every ``kill_min`` to ``kill_max`` seconds a fault of ``faults`` on a random node
    (root included): a kill (SIGKILL, restarted at once with the same id, endpoint and
    parents) or a stop (SIGSTOP, SIGCONT ``stop_min`` to ``stop_max`` seconds later; a
    stopped node is not stopped again, and a kill ends its stop)."""

    def __init__(self, tree: LocalTree, s: ChaosSettings, hosts: NetHosts | None = None) -> None:
        super().__init__(name="chaos", daemon=True)
        self.tree, self.s, self.hosts = tree, s, hosts
        self.rng = random.Random(s.seed)
        self.stop = threading.Event()
        self.kills = self.root_kills = 0
        self.stops: list[_Stop] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()  # the stopped nodes (resume_all from another thread)
        self._stopped: dict[str, tuple[Any, float, _Stop]] = {}  # handle, resume at, record
        # network faults: node -> (undo, undo at, record, the nodes it holds)
        self._net: dict[str, tuple[Callable[[], None], float, _Stop, set[str]]] = {}

    def run(self) -> None:
        try:
            due = time.monotonic() + self.rng.uniform(self.s.kill_min, self.s.kill_max)
            while True:
                with self._lock:
                    wake = min(
                        [
                            due,
                            *(r for _, r, _ in self._stopped.values()),
                            *(r for _, r, _, _ in self._net.values()),
                        ]
                    )
                if self.stop.wait(max(0.0, wake - time.monotonic())):
                    return
                now = time.monotonic()
                self._resume(now)
                if now >= due and (self.s.overlap or not self._busy()):
                    self._fault()
                    due = now + self.rng.uniform(self.s.kill_min, self.s.kill_max)
        except BaseException as e:  # noqa: BLE001 - reported by run_case
            self.error = e
        finally:
            self.resume_all()

    def _spared(self, node: str) -> bool:
        """Whether ``node`` gets no fault (the root, with ``spare_root``)."""
        return self.s.spare_root and node == self.tree.tree.root

    def _busy(self) -> set[str]:
        """Nodes under a stop or a network fault (not chosen for another)."""
        with self._lock:
            return set(self._stopped).union(*(held for *_, held in self._net.values()))

    def _fault(self) -> None:
        kind = self.rng.choice(self.s.faults)
        if kind in NET_FAULTS:
            self._net_fault(kind)
            return
        stopped = self._busy()
        names = sorted(n for n in self.tree.nodes if not self._spared(n))
        if kind == "stops":
            names = [n for n in names if n not in stopped]
            if not names:
                return
        node = self.rng.choice(names)
        root = node == self.tree.tree.root
        if kind == "kills":
            self._continue(node, time.time(), kill=True)
            self.tree.restart(node)  # SIGKILL, then the same node again
            self.kills += 1
            self.root_kills += root
            return
        h = self.tree.nodes[node]
        os.kill(h.pid, signal.SIGSTOP)
        record = _Stop(node, h.address, time.time())
        resume_at = time.monotonic() + self.rng.uniform(self.s.stop_min, self.s.stop_max)
        with self._lock:
            self._stopped[node] = (h, resume_at, record)
            self.stops.append(record)

    def _net_fault(self, kind: str) -> None:
        """A partition or one-way cut (dstltree.bench.chaos_net) of a node not busy."""
        assert self.hosts is not None, "network faults need hosts of their own"
        parents = {n: list(self.tree.tree.parents(n)) for n in self.tree.tree.nodes}
        span = (self.s.cut_min, self.s.cut_max)
        spared = {n for n in parents if self._spared(n)}
        fault = chaos_net.choose(kind, self.rng, parents, self._busy() | spared, span)
        if fault is None:
            return
        watched = fault.parent if fault.parent is not None else fault.node
        record = _Stop(fault.node, self.tree.address(watched), time.time(), kind=kind)
        undo = chaos_net.apply(self.hosts, fault)
        held = {fault.node} | ({fault.parent} if fault.parent else set())
        with self._lock:
            self._net[fault.node] = (undo, time.monotonic() + fault.seconds, record, held)
            self.stops.append(record)

    def _resume(self, now: float) -> None:
        with self._lock:
            due = [n for n, (_, at, _) in self._stopped.items() if at <= now]
            net = [n for n, (_, at, _, _) in self._net.items() if at <= now]
        for node in due:
            self._continue(node, time.time())
        for node in net:
            self._undo_net(node)

    def _undo_net(self, node: str) -> None:
        with self._lock:
            entry = self._net.pop(node, None)
        if entry is not None:
            undo, _, record, _ = entry
            undo()
            record.end = time.time()

    def _continue(self, node: str, wall: float, kill: bool = False) -> None:
        """End the stop of ``node`` (if stopped): SIGCONT, unless it is about to be
        killed."""
        with self._lock:
            entry = self._stopped.pop(node, None)
        if entry is None:
            return
        h, _, record = entry
        record.end = wall
        if not kill and h.process.poll() is None:
            os.kill(h.pid, signal.SIGCONT)

    def resume_all(self) -> None:
        """SIGCONT every node still stopped and undo every network fault (idempotent;
        before the tree stops)."""
        with self._lock:
            nodes, net = list(self._stopped), list(self._net)
        for node in nodes:
            self._continue(node, time.time())
        for node in net:
            self._undo_net(node)


def _topology(
    workdir: Path, parents: dict[str, list[str]], s: ChaosSettings, hosts: NetHosts | None
) -> Path:
    nodes = (
        [{"id": n, "bind": "auto", **({"parents": p} if p else {})} for n, p in parents.items()]
        if hosts is None
        else chaos_net.node_specs(hosts, parents)
    )
    doc = {
        "base_path": str(workdir / "dfs"),
        "parent_timeout": 2.0,
        "ping_interval": s.ping_interval,
        "liveness_timeout": s.liveness_timeout,
        "nodes": nodes,
    }
    path = workdir / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _client(tree: LocalTree, workdir: Path, nodes: list[str], s: ChaosSettings) -> ChangelogClient:
    """A writer's client of ``nodes`` (in order of preference) with the settings of
    ``s``."""
    store = ObjectStore(str(workdir / "dfs"))
    uploader = NodeUploader(
        nodes,
        store,
        ack_timeout=s.ack_timeout,
        security=tree.client_security,
        hold_down=s.hold_down,
        ping_interval=s.ping_interval,
        liveness_timeout=s.liveness_timeout,
    )
    return ChangelogClient(store, uploader, DEFAULT_PREEMPTIVE_BYTES)


def _writer_nodes(tree: LocalTree, index: int, two: bool) -> list[str]:
    order = tree.tree.nodes
    own, neighbour = order[index % len(order)], order[(index + 1) % len(order)]
    return [tree.address(own), tree.address(neighbour)] if two else [tree.address(own)]


def run_case(name: str, s: ChaosSettings, workdir: Path, *, dag: bool, faults: bool) -> ChaosResult:
    """One case on a fresh tree under ``workdir`` (see the module docstring), with the
    faults of ``s`` if ``faults``; with network faults in ``s`` every node on a host of
    its own (the case without faults too, for a like comparison). Raises RuntimeError
    when the fault thread failed (a node did not come back), NetnsError when hosts
    cannot be made."""
    parents = DAG if dag else TREE
    hosts = NetHosts(list(parents)) if s.netns else None
    try:
        return _run_case(name, s, workdir, parents, hosts, dag=dag, faults=faults)
    finally:
        if hosts is not None:
            hosts.close()


def _run_case(
    name: str,
    s: ChaosSettings,
    workdir: Path,
    parents: dict[str, list[str]],
    hosts: NetHosts | None,
    *,
    dag: bool,
    faults: bool,
) -> ChaosResult:
    path = _topology(workdir, parents, s, hosts)
    prefixes = {} if hosts is None else {n: hosts.prefix(n) for n in parents}
    tree = start_tree(load_topology(path), path, workdir=workdir, prefixes=prefixes)
    result = ChaosResult(name, s.seconds)
    chaos = _Chaos(tree, s, hosts)
    writers: list[_Writer] = []
    left: list[_Left] = []  # the writers' failovers
    try:
        for i in range(s.writers):
            writers.append(_Writer(i, _client(tree, workdir, _writer_nodes(tree, i, dag), s), s))
        for w in writers:
            w.start()
        if faults:
            chaos.start()
        time.sleep(s.seconds)  # the run itself: writers and faults go on meanwhile
        left = _stop(chaos, writers, result)
    finally:
        chaos.stop.set()
        if chaos.is_alive():
            chaos.join(timeout=60)
        chaos.resume_all()  # a stopped node would not see its SIGTERM
        for w in writers:
            w.stop.set()
            w.client.close()
        tree.stop()
    if chaos.error is not None:
        raise RuntimeError(f"chaos: {chaos.error}") from chaos.error
    _detections(chaos.stops, left + _node_silences(tree), tree.tree.root, result)
    _check(ObjectStore(str(workdir / "dfs")), writers, result)
    return result


_Left = tuple[float, str, float]  # (wall-clock time, address left, there since)


def _node_silences(tree: LocalTree) -> list[_Left]:
    """The nodes' moves away from a silent or refusing upstream node, from their final
    statistics (a killed incarnation's are lost)."""
    out: list[_Left] = []
    for h in tree.nodes.values():
        if h.stats_file is not None and h.stats_file.exists():
            doc = json.loads(h.stats_file.read_text())
            out += [(float(t), str(a), float(since)) for t, a, since in doc.get("silence_log", [])]
    return out


def _detections(stops: list[_Stop], left: list[_Left], root: str, result: ChaosResult) -> None:
    """Per fault other than a kill, the time from its start (SIGSTOP, cut) to the first
    move away from its address while it lasted, by a writer or node that was there
    before (else it counts as undetected: nobody was using it); the one-way cuts'
    median apart."""
    result.stops = sum(st.kind == "stops" for st in stops)
    result.root_stops = sum(st.kind == "stops" and st.node == root for st in stops)
    result.partitions = sum(st.kind == "partitions" for st in stops)
    result.root_partitions = sum(st.kind == "partitions" and st.node == root for st in stops)
    result.oneways = sum(st.kind == "oneway" for st in stops)
    oneway: list[float] = []
    for st in stops:
        end = st.end if st.end is not None else float("inf")
        times = [
            t - st.start
            for t, a, since in left
            if a == st.address and since <= st.start <= t <= end
        ]
        if times:
            result.detections.append(min(times))
            if st.kind == "oneway":
                oneway.append(min(times))
        else:
            result.undetected += 1
    if oneway:
        result.oneway_p50_s = statistics.median(oneway)
    if result.detections:
        result.detect_p50_s = statistics.median(result.detections)
        result.detect_max_s = max(result.detections)


def _stop(chaos: _Chaos, writers: list[_Writer], result: ChaosResult) -> list[_Left]:
    """Stop the faults and the writers; their figures into ``result``. Returns the
    writers' failovers."""
    chaos.stop.set()
    if chaos.is_alive():
        chaos.join(timeout=60)
    for w in writers:
        w.stop.set()
    for w in writers:
        w.join(timeout=180)
    result.kills, result.root_kills = chaos.kills, chaos.root_kills
    left: list[_Left] = []
    for w in writers:
        st = w.client.uploader.statistics()  # type: ignore[attr-defined]
        result.fallbacks += st.fallbacks
        result.failovers += st.failovers
        result.resent += st.resent
        result.persist_errors += w.errors
        result.latencies += w.latencies
        left += st.failover_log
    lat = sorted(result.latencies)
    result.persists = len(lat)
    if lat:
        result.p50_s = statistics.median(lat)
        result.p99_s = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        result.max_s = lat[-1]
    return left


def _check(store: ObjectStore, writers: list[_Writer], result: ChaosResult) -> None:
    """Read every writer's acknowledged changes back through its last handle
    (:func:`dstltree.bench.history.check`); then the orphans: found, swept (deleted),
    counted again."""
    h = history.check(store, (history.WriterHistory(w.acked, w.handle) for w in writers))
    result.changes_checked += h.checked
    result.lost += h.lost
    result.duplicated += h.duplicated
    result.out_of_order += h.out_of_order
    result.missing_objects += h.missing_objects
    referenced = h.referenced
    found = scan_orphans(store, referenced).orphans
    sizes = {i.url: i.size for i in list_data_info(store)}
    result.reservations_found = sum(1 for u in found if sizes.get(u) == 0)
    result.orphans_found = len(found) - result.reservations_found
    store.delete(found)
    result.orphans_after_sweep = len(scan_orphans(store, referenced).orphans)


def cases(faults: tuple[str, ...] = FAULTS) -> tuple[tuple[str, bool, bool], ...]:
    """The three cases (name, DAG?, faults?) of a run with ``faults``."""
    label = " and ".join(faults)
    return (
        ("dag, no faults", True, False),
        (f"dag, {label}", True, True),
        (f"tree, {label}", False, True),
    )


def run_chaos(
    s: ChaosSettings,
    workdir: str | None = None,
    which: tuple[tuple[str, bool, bool], ...] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[ChaosResult]:
    """Every case of ``which`` (name, DAG?, faults?; default :func:`cases` of
    ``s.faults``) in turn, each in its own directory under ``workdir`` (default: a
    temporary one, removed afterwards)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="dstl-chaos-", dir=workdir) as root:
        for k, (name, dag, faults) in enumerate(which or cases(s.faults)):
            if progress is not None:
                progress(name)
            wd = Path(root) / f"case{k}"
            wd.mkdir()
            out.append(run_case(name, s, wd, dag=dag, faults=faults))
    return out
