"""The chaos benchmark (``dstl bench chaos``): a 7-node topology of node processes under
16 writers while a random node, the root included, is killed hard (SIGKILL) and
restarted with the same id and endpoint every 1-2 s. Three cases in one run, each on a
fresh tree and store:

- ``dag, no kills``: the DAG (every node below the root names a second parent in the
  other subtree) and writers with two nodes each (their own, then a neighbour's);
- ``dag, kills``: the same under the kills;
- ``tree, kills``: first parents only and one node per writer, under the same kill
  schedule (the seed fixes it): what a tree without second ways up gives.

Per case: persist latencies (``persist_durably`` to a durable handle, seconds), changes
lost, duplicated or out of order (every writer's acknowledged changes read back through
its last handle), handle objects missing, the writers' direct DFS writes (fallbacks),
failovers and re-sent segments, and the orphans: files no handle references once the
nodes stopped (second copies of re-sent segments, object files reserved by killed
nodes), deleted by the registry's sweep, then counted again.
"""

from __future__ import annotations

import random
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
from dstltree.bench.hotpath import markdown_table
from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.client.reader import iter_changes
from dstltree.coordinator.cleanup import list_data_info, scan_orphans
from dstltree.topology.config import load_topology

__all__ = ["ChaosResult", "ChaosSettings", "run_case", "run_chaos", "TREE", "DAG"]

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


@dataclass(frozen=True)
class ChaosSettings:
    """``seconds`` per case; ``writers`` threads, each persisting ``changes`` changes of
    ``change_bytes`` bytes every ``interval`` seconds; a kill every ``kill_min`` to
    ``kill_max`` seconds (uniform, ``seed``); writers wait ``ack_timeout`` seconds for
    a node's ack before writing to the DFS themselves, and go back to their own node
    after ``hold_down`` seconds up."""

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


@dataclass
class ChaosResult:
    """One case's figures (latencies in seconds)."""

    case: str
    seconds: float
    kills: int = 0
    root_kills: int = 0
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

    def figures(self) -> dict[str, Any]:
        """The result without the raw latencies (JSON)."""
        d = asdict(self)
        d.pop("latencies")
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


class _Chaos(threading.Thread):
    """Kills a random node (root included) with SIGKILL every ``kill_min`` to
    ``kill_max`` seconds and restarts it at once (same id, endpoint and parents)."""

    def __init__(self, tree: LocalTree, s: ChaosSettings) -> None:
        super().__init__(name="chaos", daemon=True)
        self.tree, self.s = tree, s
        self.rng = random.Random(s.seed)
        self.stop = threading.Event()
        self.kills = self.root_kills = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(self.rng.uniform(self.s.kill_min, self.s.kill_max)):
                node = self.rng.choice(sorted(self.tree.nodes))
                self.tree.restart(node)  # SIGKILL, then the same node again
                self.kills += 1
                self.root_kills += node == self.tree.tree.root
        except BaseException as e:  # noqa: BLE001 - reported by run_case
            self.error = e


def _topology(workdir: Path, parents: dict[str, list[str]]) -> Path:
    nodes = [{"id": n, "bind": "auto", **({"parents": p} if p else {})} for n, p in parents.items()]
    doc = {"base_path": str(workdir / "dfs"), "parent_timeout": 2.0, "nodes": nodes}
    path = workdir / "topology.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _writer_nodes(tree: LocalTree, index: int, two: bool) -> list[str]:
    order = tree.tree.nodes
    own, neighbour = order[index % len(order)], order[(index + 1) % len(order)]
    return [tree.address(own), tree.address(neighbour)] if two else [tree.address(own)]


def run_case(name: str, s: ChaosSettings, workdir: Path, *, dag: bool, kills: bool) -> ChaosResult:
    """One case on a fresh tree under ``workdir`` (see the module docstring). Raises
    RuntimeError when the kill thread failed (a node did not come back)."""
    path = _topology(workdir, DAG if dag else TREE)
    tree = start_tree(load_topology(path), path, workdir=workdir)
    result = ChaosResult(name, s.seconds)
    chaos = _Chaos(tree, s)
    writers: list[_Writer] = []
    try:
        for i in range(s.writers):
            client = ChangelogClient.open(
                str(workdir / "dfs"),
                node=_writer_nodes(tree, i, two=dag),
                ack_timeout=s.ack_timeout,
                security=tree.client_security,
                hold_down=s.hold_down,
            )
            writers.append(_Writer(i, client, s))
        for w in writers:
            w.start()
        if kills:
            chaos.start()
        time.sleep(s.seconds)  # the run itself: writers and kills go on meanwhile
        _stop(chaos, writers, result)
    finally:
        chaos.stop.set()
        for w in writers:
            w.stop.set()
            w.client.close()
        tree.stop()
    if chaos.error is not None:
        raise RuntimeError(f"chaos: {chaos.error}") from chaos.error
    _check(ObjectStore(str(workdir / "dfs")), writers, result)
    return result


def _stop(chaos: _Chaos, writers: list[_Writer], result: ChaosResult) -> None:
    chaos.stop.set()
    if chaos.is_alive():
        chaos.join(timeout=60)
    for w in writers:
        w.stop.set()
    for w in writers:
        w.join(timeout=180)
    result.kills, result.root_kills = chaos.kills, chaos.root_kills
    for w in writers:
        st = w.client.uploader.statistics()  # type: ignore[attr-defined]
        result.fallbacks += st.fallbacks
        result.failovers += st.failovers
        result.resent += st.resent
        result.persist_errors += w.errors
        result.latencies += w.latencies
    lat = sorted(result.latencies)
    result.persists = len(lat)
    if lat:
        result.p50_s = statistics.median(lat)
        result.p99_s = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        result.max_s = lat[-1]


def _check(store: ObjectStore, writers: list[_Writer], result: ChaosResult) -> None:
    """Read every writer's acknowledged changes back through its last handle; then the
    orphans: found, swept (deleted), counted again."""
    referenced: set[str] = set()
    for w in writers:
        if w.handle is None:
            result.lost += len(w.acked)
            continue
        paths = w.handle.object_paths()
        referenced |= paths
        result.missing_objects += sum(not store.exists(p) for p in paths)
        got = [(kg, c) for _, kg, c in iter_changes(store, w.handle)]
        result.changes_checked += len(w.acked)
        result.lost += len(set(w.acked) - set(got))
        result.duplicated += len(got) - len(set(got))
        # order is per key group: each one's changes as appended
        result.out_of_order += sum(
            [c for g, c in got if g == kg] != [c for g, c in w.acked if g == kg] for kg in range(4)
        )
    found = scan_orphans(store, referenced).orphans
    sizes = {i.url: i.size for i in list_data_info(store)}
    result.reservations_found = sum(1 for u in found if sizes.get(u) == 0)
    result.orphans_found = len(found) - result.reservations_found
    store.delete(found)
    result.orphans_after_sweep = len(scan_orphans(store, referenced).orphans)


CASES = (("dag, no kills", True, False), ("dag, kills", True, True), ("tree, kills", False, True))


def run_chaos(
    s: ChaosSettings,
    workdir: str | None = None,
    cases: tuple[tuple[str, bool, bool], ...] = CASES,
    progress: Callable[[str], None] | None = None,
) -> list[ChaosResult]:
    """Every case of ``cases`` (name, DAG?, kills?) in turn, each in its own
    directory under ``workdir`` (default: a temporary one, removed afterwards)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="dstl-chaos-", dir=workdir) as root:
        for k, (name, dag, kills) in enumerate(cases):
            if progress is not None:
                progress(name)
            wd = Path(root) / f"case{k}"
            wd.mkdir()
            out.append(run_case(name, s, wd, dag=dag, kills=kills))
    return out


SECTION = "Chaos"
HEADERS = (
    "case",
    "kills (root)",
    "persists",
    "p50 ms",
    "p99 ms",
    "max ms",
    "p99 / no kills",
    "lost / dup / order",
    "missing objects",
    "fallbacks",
    "failovers (resent)",
    "orphans (reserved) -> after sweep",
)


def table_rows(results: list[ChaosResult]) -> list[list[str]]:
    """One row per case; the p99 ratio is against the first case without kills."""
    calm = next((r for r in results if r.kills == 0 and r.p99_s > 0), None)
    rows = []
    for r in results:
        ratio = f"{r.p99_s / calm.p99_s:.2f}x" if calm is not None else "-"
        rows.append(
            [
                r.case,
                f"{r.kills} ({r.root_kills})",
                str(r.persists),
                f"{r.p50_s * 1e3:.1f}",
                f"{r.p99_s * 1e3:.1f}",
                f"{r.max_s * 1e3:.0f}",
                ratio,
                f"{r.lost} / {r.duplicated} / {r.out_of_order}",
                str(r.missing_objects),
                str(r.fallbacks),
                f"{r.failovers} ({r.resent})",
                f"{r.orphans_found} ({r.reservations_found}) -> {r.orphans_after_sweep}",
            ]
        )
    return rows


_HOW = """How each case is measured (dstltree/bench/chaos.py): 7 node processes in
deploy/local.yaml's shape (CURVE on, `parent_timeout` 2 s), 16 writer threads in the
benchmark's process, each persisting 3 changes of 1,000 bytes every 0.2 s
(`persist_durably` to a durable handle: the latency), ack timeout 10 s, hold-down 5 s.
The kills: a random node, the root included, SIGKILLed every 1-2 s (uniform, seed 7)
and started again at once with the same id, endpoint and parents. "dag": second parents
and two nodes per writer (its own, then the next one's); "tree": first parents only and
one node per writer. Afterwards every writer's acknowledged changes are read back
through its last handle (lost, duplicated, out of order per key group), every object a
handle names must exist, and the files no handle references once the nodes stopped are
counted (empty object files a killed node had reserved in brackets), deleted as the
registry's sweep does, and counted again.
"""


def markdown_section(results: list[ChaosResult], meta: dict[str, str], nproc: int) -> str:
    """The ``## Chaos`` section of BENCHMARKS.md: command, commit, date, the table."""
    lines = [
        f"## {SECTION}",
        "",
        f"`{meta['command']}` on commit {meta['commit']}, {meta['date']}, `nproc` = {nproc} "
        "(shared and noisy: compare the ratios of one run).",
        "",
        *markdown_table(HEADERS, table_rows(results)),
    ]
    return "\n".join(lines) + "\n\n" + _HOW
