"""``dstl bench structured-streaming``: the same Structured Streaming query with and
without the tree, side by side, at several shuffle partition counts.

Per partition count two runs, each in a fresh Spark session on ``local[N]`` and with a
fresh input folder and checkpoint location (:mod:`dstltree.bench.ss_query`): ``spark``
(Spark alone, RocksDB provider with changelog checkpointing, every state file a file
under the checkpoint location), ``tree`` (the same, with
``structured_streaming.configure``: state files go through the bridge into the tree,
the metadata logs stay plain files) and ``dstl`` (the same on a ``dstl://`` location:
every file of the location through the bridge, nothing on the latency file system).
For ``dstl`` the critical path of each batch is counted from the objects' indexes: the
distinct objects holding its ``sources/0/<N>``, ``offsets/<N>`` and ``commits/<N>``
(each one PUT the driver waits for; the batch's state files ride in the commit's).

``dfs_model`` (a ``topology.latency`` model name, or ``none``) puts the same latency on
both: Spark's checkpoint location is ``latency:/...``, served by the jar's
``io.dstltree.spark.LatencyFileSystem`` with the model's table, and the tree's base path
is wrapped in ``faulty::`` with ``--dfs-faults``'s spec of the same model
(:func:`dstltree.storage.targets.with_faults`). Both draw from the same seed.
``minBatchesToRetain`` is set above the batch count so that nothing is deleted during
a run: the files counted are the files written.

``hosts`` N > 0 (``--hosts N``): the runs go to a Spark standalone cluster of N
workers, each on its own loopback host (``dstl cluster``'s classes) with its own node
and bridge (``DSTLTREE_BRIDGE_SOCKET`` in the worker's environment), and the driver on
this process's host with a third bridge on the tree's root and no executor: every state
file is written on a host other than the driver's. Spark's requests by kind are then
counted in the driver's JVM only (the executors' LatencyFileSystem counters stay in
their JVMs): the metadata logs' requests, not the state files'.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dstltree.bench.ss_query import QueryFigures, QueryInput, run_query

__all__ = ["ENGINES", "SsBenchSettings", "SsRun", "latency_conf", "run_ss_bench"]

ENGINES = ("spark", "tree", "dstl")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
LATENCY_SCHEME = "latency"
LATENCY_CLASS = "io.dstltree.spark.LatencyFileSystem"
NO_MODEL = "none"


@dataclass(frozen=True)
class SsBenchSettings:
    """One bench invocation. ``batches`` input files (one per batch) of ``rows`` rows
    over ``keys`` keys; ``trigger_s`` the trigger interval (seconds) and
    ``held_factor`` the interval a batch start may lag (times the trigger);
    ``dfs_model`` a latency model or ``none``, its latencies times ``scale``;
    ``cores``: ``local[cores]``; ``timeout_s`` per run; ``persist_delay_s`` the
    tree's persist delay (seconds); ``warmup``: first batches left out of the batch
    duration and trigger figures (state store start-up: RocksDB instances, folders);
    ``maintenance_s``: the state maintenance interval (seconds; a snapshot, zip and SST
    files, every 10 versions of a partition, counted with the files written).
    ``hosts``: 0 for ``local[cores]``, else worker hosts of a standalone cluster
    (module docstring), ``cores`` cores each.
    Raises ValueError for an unknown model or out-of-range numbers."""

    partitions: tuple[int, ...] = (4, 200)
    batches: int = 20
    rows: int = 2000
    keys: int = 1000
    trigger_s: float = 0.3
    held_factor: float = 1.5
    dfs_model: str = NO_MODEL
    scale: float = 1.0
    seed: int = 0
    cores: int = 4
    timeout_s: float = 900.0
    persist_delay_s: float = 0.05
    warmup: int = 1
    maintenance_s: float = 1.0
    hosts: int = 0

    def __post_init__(self) -> None:
        from dstltree.topology.latency import get_model

        if self.dfs_model != NO_MODEL:
            get_model(self.dfs_model)
        if not self.partitions or min(self.partitions) < 1:
            raise ValueError(f"partitions must be >= 1, got {self.partitions}")
        if min(self.batches, self.rows, self.keys, self.cores) < 1:
            raise ValueError("batches, rows, keys and cores must be >= 1")
        if not (self.trigger_s > 0 and self.held_factor >= 1 and self.scale > 0):
            raise ValueError("trigger_s and scale must be > 0, held_factor >= 1")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.maintenance_s <= 0:
            raise ValueError(f"maintenance_s must be > 0, got {self.maintenance_s}")
        if not 0 <= self.hosts <= 8:
            raise ValueError(f"hosts must be 0..8, got {self.hosts}")
        if self.persist_delay_s < 0:
            raise ValueError(f"persist_delay_s must be >= 0, got {self.persist_delay_s}")

    @property
    def fault_spec(self) -> str | None:
        """The ``--dfs-faults`` spec of the tree's DFS (None: no latency)."""
        if self.dfs_model == NO_MODEL:
            return None
        return f"{self.dfs_model},scale={self.scale:g},seed={self.seed}"


@dataclass(frozen=True)
class SsRun:
    """One run: ``engine`` (spark | tree), shuffle ``partitions``, the query's figures,
    objects the tree wrote during it (0 for spark) and Spark's requests on the
    latency file system by kind (empty without a model)."""

    engine: str
    partitions: int
    figures: QueryFigures
    tree_objects: int
    spark_requests: dict[str, int]
    critical_puts: dict[int, int] = field(default_factory=dict)  # dstl: batch -> PUTs
    tree_requests: dict[str, int] = field(default_factory=dict)  # the tree's, by kind

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict, per-batch figures included."""
        f = self.figures
        return {
            "engine": self.engine,
            "partitions": self.partitions,
            **asdict(f),
            "files_per_batch": f.checkpoint_files / f.batches,
            "bytes_per_batch": f.checkpoint_bytes / f.batches,
            "tree_objects": self.tree_objects,
            "tree_objects_per_batch": self.tree_objects / f.batches,
            "written_per_batch": (f.checkpoint_files + self.tree_objects) / f.batches,
            "spark_requests": self.spark_requests,
            "tree_requests": self.tree_requests,
            "requests_per_batch": self.requests_per_batch,
            "critical_puts_per_batch": self.critical_per_batch,
        }

    @property
    def requests_per_batch(self) -> dict[str, float]:
        """Requests per batch that reached a store, by kind (put, get, head, list,
        delete, rename, mkdirs): Spark's on the latency file system plus the tree's
        (its nodes' and bridges', from the request log)."""
        total: dict[str, int] = {}
        for src in (self.spark_requests, self.tree_requests):
            for k, n in src.items():
                total[k] = total.get(k, 0) + n
        return {k: round(n / self.figures.batches, 2) for k, n in total.items() if n}

    @property
    def critical_per_batch(self) -> float | None:
        """Mean PUTs a batch of a ``dstl`` run waited for (batches with input after the
        first; None for the other engines)."""
        later = [n for b, n in self.critical_puts.items() if b > 0]
        return sum(later) / len(later) if later else None


def latency_conf(model_name: str, scale: float = 1.0, seed: int = 0) -> dict[str, str]:
    """Spark settings that serve ``latency:`` paths with the jar's LatencyFileSystem
    drawing from the ``topology.latency`` model ``model_name`` (times ``scale``) with
    ``seed``. Raises ValueError for an unknown model."""
    from dstltree.topology.latency import get_model

    model = get_model(model_name)
    model = model if scale == 1 else model.scaled(scale)
    table = ",".join(f"{p:g}:{s!r}" for p, s in model.percentiles.items())
    conf = {
        f"fs.{LATENCY_SCHEME}.impl": LATENCY_CLASS,
        "dstltree.latency.percentiles": table,
        "dstltree.latency.referenceBytes": str(model.reference_bytes),
        "dstltree.latency.bandwidth": repr(float(model.bandwidth)),
        "dstltree.latency.floor": repr(model.floor_s),
        "dstltree.latency.floorFraction": repr(model.floor_fraction),
        "dstltree.latency.seed": str(seed),
    }
    return {f"spark.hadoop.{k}": v for k, v in conf.items()}


def _topology(work: Path, hedged: bool, persist_delay_s: float, hosts: int = 0) -> Path:
    """A two-node tree (root and one leaf, the host's node), or with ``hosts`` the root
    (the driver's host) and one node per worker host below it, with ``persist_delay_s``
    (seconds); uploads hedged after the p75 of recent latencies on an object store
    (docs/tuning.md)."""
    path = work / "topology.yaml"
    hedging = "upload_adaptive_percentile: 75\n" if hedged else ""
    leaves = [f"h{i}" for i in range(hosts)] or ["a"]
    path.write_text(
        "base_path: dstl\n"
        "target_object_bytes: 4MiB\n"
        f"persist_delay: {persist_delay_s:g}\n"
        f"{hedging}"
        "nodes:\n"
        "  - {id: root, bind: auto}\n"
        + "".join(f"  - {{id: {leaf}, bind: auto, parent: root}}\n" for leaf in leaves)
    )
    return path


def host_sockets(services: Any, hosts: int) -> list[Path]:
    """The bridge socket of each worker host, in the services' private folder (a socket
    path has at most 107 bytes)."""
    return [services.workdir / f"host{i}.sock" for i in range(hosts)]


@contextmanager
def _tree(work: Path, settings: SsBenchSettings) -> Iterator[tuple[Any, Path]]:
    """Nodes and a bridge on this machine for the tree runs: (services, the local
    folder of the tree's objects); stopped by PID on exit."""
    from dstltree.storage.targets import with_faults
    from dstltree.structured_streaming.configure import start_local

    folder = work / "tree"
    # behind faulty:: even without a model: its request log counts the tree's requests
    base, opts = with_faults(str(folder), {}, settings.fault_spec or NO_MODEL)
    opts["faulty"]["request_log"] = str(request_log(work))
    hosts = settings.hosts
    services = start_local(
        _topology(work, settings.fault_spec is not None, settings.persist_delay_s, hosts),
        base_path=base,
        storage_options=opts,
        bridge_node="root" if hosts else None,
    )
    try:
        for i, sock in enumerate(host_sockets(services, hosts)):
            services.add_bridge(sock, node=f"h{i}")  # the worker host's bridge, its node
        yield services, folder
    finally:
        services.stop()


@contextmanager
def _cluster(work: Path, settings: SsBenchSettings, services: Any) -> Iterator[str | None]:
    """The master URL of a standalone cluster of ``settings.hosts`` worker hosts, each
    with its bridge's socket in its environment (None, no cluster, for 0 hosts);
    stopped by PID on exit."""
    if not settings.hosts:
        yield None
        return
    from dstltree.cli.commands.cluster import start_cluster

    env = [{"DSTLTREE_BRIDGE_SOCKET": str(s)} for s in host_sockets(services, settings.hosts)]
    cluster = start_cluster(
        work / "standalone", settings.hosts, settings.cores, "2g", worker_env=env
    )
    try:
        yield cluster.master_url
    finally:
        cluster.stop()


def _builder(settings: SsBenchSettings, partitions: int, master: str | None = None) -> Any:
    """A quiet loopback ``local[cores]`` builder (or one for the standalone ``master``)
    with the query's state store settings (and the latency file system when a model is
    set)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from dstltree.sparkplug.spark_session import LOG4J
    from dstltree.structured_streaming import jar_path

    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    maintenance_ms = round(settings.maintenance_s * 1000)
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.minBatchesToRetain": str(settings.batches + 10),
        "spark.sql.streaming.stateStore.maintenanceInterval": f"{maintenance_ms}ms",
        "spark.sql.streaming.numRecentProgressUpdates": str(settings.batches + 100),
    }
    if settings.dfs_model != NO_MODEL:
        conf.update(latency_conf(settings.dfs_model, settings.scale, settings.seed))
    jar = str(jar_path())
    conf["spark.jars"] = jar
    conf["spark.driver.extraClassPath"] = jar  # Hadoop finds the file system class
    if master is not None:  # the executors' JVMs on this machine: the same jar file
        from dstltree.cli.commands.cluster import QUICK_JVM

        conf["spark.executor.extraClassPath"] = jar
        conf["spark.executor.memory"] = "1g"
        conf["spark.driver.extraJavaOptions"] += f" {QUICK_JVM}"
        conf["spark.executor.extraJavaOptions"] += f" {QUICK_JVM}"
    url = master or f"local[{settings.cores}]"
    builder = SparkSession.builder.master(url).appName("dstl-bench-ss")
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder


def _spark_requests(spark: Any) -> dict[str, int]:
    """Requests of this JVM's LatencyFileSystem by kind (the class loaded: the jar is on
    the driver's class path in every run, see structured_streaming.configure)."""
    cls = spark._jvm.io.dstltree.spark.LatencyFileSystem
    kinds = ("put", "get", "head", "list", "delete", "rename", "mkdirs")
    return {k: int(cls.requests(k)) for k in kinds}


def _close_latency_fs(spark: Any) -> None:
    """Drop the cached LatencyFileSystem so that the next run draws from the seed
    again (a new instance)."""
    jvm = spark._jvm
    uri = jvm.java.net.URI(f"{LATENCY_SCHEME}:///")
    jvm.org.apache.hadoop.fs.FileSystem.get(uri, spark._jsc.hadoopConfiguration()).close()


def _one_run(
    settings: SsBenchSettings,
    work: Path,
    engine: str,
    partitions: int,
    socket: Path | None,
    master: str | None = None,
) -> tuple[QueryFigures, dict[str, int]]:
    """One run in a fresh session: the query's figures and Spark's requests (by kind)
    on the latency file system during it."""
    from dstltree.structured_streaming import configure, jar_path
    from dstltree.structured_streaming.configure import add_to_running_driver

    builder = _builder(settings, partitions, master)
    if engine == "dstl":
        builder = configure(builder, socket=socket, file_systems={"file": ""})
    elif engine == "tree":  # the latency file system wrapped too: SST files reach the tree
        wrapped = {"file": ""}
        if settings.dfs_model != NO_MODEL:
            wrapped[LATENCY_SCHEME] = LATENCY_CLASS
        builder = configure(builder, socket=socket, file_systems=wrapped)
    else:  # the jar (the latency file system lives in it), not the manager
        add_to_running_driver(str(jar_path()))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if master is not None:
        _await_executors(spark, settings.hosts, settings.timeout_s)
    run_dir = work / f"{engine}-{partitions}"
    scheme = "file" if settings.dfs_model == NO_MODEL else LATENCY_SCHEME
    spec = QueryInput(
        settings.batches, settings.rows, settings.keys, settings.trigger_s, settings.seed
    )
    location = f"{scheme}:{run_dir / 'checkpoint'}"
    if engine == "dstl":
        location = dstl_location(run_dir)
    try:
        before = _spark_requests(spark) if scheme == LATENCY_SCHEME else {}
        figures = run_query(
            spark,
            run_dir / "in",
            location,
            spec,
            settings.held_factor,
            settings.timeout_s,
            settings.warmup,
        )
        requests: dict[str, int] = {}
        if before:
            after = _spark_requests(spark)
            requests = {k: after[k] - before[k] for k in after}
            _close_latency_fs(spark)
        return figures, requests
    finally:
        spark.stop()


def request_log(work: Path) -> Path:
    """The request log of the tree's store (every node and bridge appends to it:
    storage.faults.FaultyFileSystem, ``request_log``)."""
    return work / "tree-requests.log"


def tree_requests(log: Path, start: int) -> tuple[dict[str, int], int]:
    """(requests by kind in ``log`` after its first ``start`` bytes, the log's length
    now in bytes: the next run's ``start``)."""
    if not log.exists():
        return {}, start
    with open(log, "rb") as f:
        f.seek(start)
        data = f.read()
    end = start + data.rfind(b"\n") + 1  # a line being appended is the next run's
    counts: dict[str, int] = {}
    for line in data[: end - start].splitlines():
        kind = line.split(b"\t", 1)[0].decode(errors="replace")
        counts[kind] = counts.get(kind, 0) + 1
    return counts, end


def dstl_location(run_dir: Path) -> str:
    """The ``dstl://`` location of a run (a name unique to its folder)."""
    import hashlib

    return f"dstl://bench-{hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]}"


def critical_objects(objects: Path, location: str) -> dict[int, int]:
    """Per batch N of a ``dstl://`` run: the distinct objects under ``objects`` that
    hold its ``sources/0/<N>``, ``offsets/<N>`` or ``commits/<N>`` (the PUTs its
    driver waited for; module docstring)."""
    from dstltree.client.reader import read_index
    from dstltree.storage.store import ObjectStore
    from dstltree.structured_streaming.view import parse_log_id, query_key

    key = query_key(location)
    store = ObjectStore(str(objects))
    holders: dict[int, set[str]] = {}
    for obj in objects.rglob("*.dstl"):
        if obj.stat().st_size == 0:
            continue
        for ref in read_index(store, str(obj), verify=False):
            parsed = parse_log_id(ref.log_id)
            if parsed is None or parsed[0] != key:
                continue
            head, _, tail = parsed[1].rpartition("/")
            if head in ("sources/0", "offsets", "commits") and tail.isdigit():
                holders.setdefault(int(tail), set()).add(str(obj))
    return {n: len(h) for n, h in sorted(holders.items())}


def _await_executors(spark: Any, hosts: int, timeout_s: float) -> None:
    """Wait until an executor of every worker host registered (the driver counts too).
    Raises TimeoutError after ``timeout_s`` seconds."""
    import time

    sc = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + timeout_s
    while sc.getExecutorMemoryStatus().size() < hosts + 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"executors of {hosts} hosts not registered in {timeout_s} s")
        time.sleep(0.2)  # polling Spark's registry: nothing to wait on


def _objects(folder: Path) -> int:
    """Objects (``*.dstl``) written under the tree's folder: not the empty files a
    local store keeps created ahead (:mod:`dstltree.storage.reserve`)."""
    if not folder.exists():
        return 0
    return sum(1 for f in folder.rglob("*.dstl") if f.stat().st_size > 0)


SETTLE_S = 7.0  # s without a new object: the bridges flushed what Spark wrote at its stop
SETTLE_TIMEOUT_S = 60.0


def _settled_objects(folder: Path) -> int:
    """:func:`_objects` once no new one appeared for SETTLE_S s (at most SETTLE_TIMEOUT_S):
    what Spark's state maintenance uploads while a session stops is held by the bridges
    and flushed once quiet (structured_streaming/files.py ``idle_flush_due``: IDLE_QUIET,
    plus the housekeeper's turn), and belongs to this run."""
    import time

    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    count, since = _objects(folder), time.monotonic()
    while time.monotonic() - since < SETTLE_S and time.monotonic() < deadline:
        time.sleep(0.5)  # polling the store's folder: the count is what is observed
        now = _objects(folder)
        if now != count:
            count, since = now, time.monotonic()
    return count


def run_ss_bench(
    settings: SsBenchSettings,
    engines: tuple[str, ...] = ENGINES,
    work: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[SsRun]:
    """Every (partitions, engine) run of ``settings``, in that order. ``work``: a
    folder for inputs, checkpoints and the tree (default: a temporary one, deleted
    afterwards). Raises JarBuildError (no JDK), BridgeStartError, TimeoutError or
    RuntimeError (a query failed)."""
    temp = work is None
    folder = Path(tempfile.mkdtemp(prefix="dstl-bench-ss-")) if work is None else work
    runs: list[SsRun] = []
    log_start = 0
    try:
        with (
            _tree(folder, settings) as (services, objects),
            _cluster(folder, settings, services) as master,
        ):
            for partitions in settings.partitions:
                for engine in engines:
                    if progress is not None:
                        progress(f"{engine}, {partitions} shuffle partitions")
                    before = _objects(objects)
                    _, log_start = tree_requests(request_log(folder), log_start)
                    socket = services.socket if engine in ("tree", "dstl") else None
                    figures, spark = _one_run(settings, folder, engine, partitions, socket, master)
                    made = _settled_objects(objects) - before
                    requests, log_start = tree_requests(request_log(folder), log_start)
                    if engine == "spark":  # the idle tree's housekeeping is not the run's
                        requests = {}
                    critical = {}
                    if engine == "dstl":
                        run_dir = folder / f"{engine}-{partitions}"
                        critical = critical_objects(objects, dstl_location(run_dir))
                    runs.append(SsRun(engine, partitions, figures, made, spark, critical, requests))
    finally:
        if temp:
            shutil.rmtree(folder, ignore_errors=True)
    return runs
