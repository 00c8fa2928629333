"""``dstl cluster up`` / ``dstl cluster down``: a Spark standalone cluster on this machine
(development and tests): one master and N workers, each its own JVM started through
pyspark's ``bin/spark-class`` (the classes ``start-master.sh`` and ``start-worker.sh`` run).

Each worker stands for a separate host: on Linux every ``127.0.0.x`` is a loopback
address, so worker i binds ``127.0.0.<i+2>`` (``--host`` and ``SPARK_LOCAL_IP``) and the
executors it launches are started for that host (their ``--hostname``); the master stays
on ``127.0.0.1``. Where only ``127.0.0.1`` can be bound, every worker uses it.

Every wait is bounded; every daemon runs in its own process group and is stopped by its
pid (SIGTERM to the group, SIGKILL after a timeout), which takes its executors and their
Python workers along. Logs (``<name>.log``), the workers' work directories (``work-<i>``)
and ``cluster.json`` (URLs and pids, for ``down``) stay in the cluster's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from dstltree.bench.netns import NetHosts

__all__ = [
    "DRIVER_HOST",
    "EXECUTOR_CLASS",
    "QUICK_JVM",
    "StandaloneCluster",
    "free_port",
    "loopback_hosts",
    "register",
    "spark_env",
    "spark_home",
    "start_cluster",
    "stop_process_groups",
]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
DRIVER_HOST = "127.0.0.1"
# JVM options for a quick start on a small machine: the client compiler only, serial GC
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
STATE_FILE = "cluster.json"


def spark_home() -> Path:
    """The folder of the installed pyspark: SPARK_HOME (``bin/``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port(host: str = DRIVER_HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago (bound to port 0, then closed).
    Raises OSError when ``host`` cannot be bound."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _bindable(host: str) -> bool:
    try:
        free_port(host)
    except OSError:
        return False
    return True


def loopback_hosts(n: int) -> list[str]:
    """``n`` worker hosts: ``127.0.0.2`` ... ``127.0.0.<n+1>`` when this OS lets a process
    bind them (Linux: the whole 127/8 is loopback), else ``127.0.0.1`` n times."""
    hosts = [f"127.0.0.{i + 2}" for i in range(n)]
    return hosts if all(_bindable(h) for h in hosts) else [DRIVER_HOST] * n


def spark_env(local_ip: str, python_path: Sequence[str] = (), **extra: str) -> dict[str, str]:
    """Environment of a Spark JVM or ``spark-submit``: this process's environment with
    this interpreter for every Python process, ``python_path`` first on ``PYTHONPATH``,
    ``local_ip`` as the address Spark binds and advertises (``SPARK_LOCAL_IP``), quick
    daemon JVMs (512 MiB heap), no master REST server (its port 6066 is fixed); ``extra``
    entries win."""
    env = dict(os.environ)
    path = [*python_path, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP=local_ip,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(dict.fromkeys(path)),
        SPARK_DAEMON_MEMORY="512m",
        SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )
    env.update(extra)
    return env


def stop_process_groups(leaders: dict[int, str | None], timeout: float = 15.0) -> None:
    """Stop the process groups led by the pids in ``leaders`` (session leaders), all at
    once: SIGTERM to every group, SIGKILL to every group after ``timeout`` seconds (to
    the members left behind in any case). A leader whose command line does not contain
    its ``expect`` string (a reused pid) is left alone; one already gone is no error."""
    import psutil

    procs, groups = [], []
    for pid, expect in leaders.items():
        try:
            proc = psutil.Process(pid)
            if expect is None or expect in proc.cmdline():
                procs.append(proc)
                groups.append(pid)
        except psutil.ZombieProcess:  # the leader is gone: only its group may be left
            groups.append(pid)
        except psutil.Error:
            continue
    _signal_groups(groups, signal.SIGTERM)
    psutil.wait_procs(procs, timeout=timeout)
    _signal_groups(groups, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=timeout)


def _signal_groups(groups: list[int], sig: signal.Signals) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


@dataclass
class StandaloneCluster:
    """A master and its workers on this machine.

    ``master_url``: ``spark://127.0.0.1:<port>``; ``webui_url``: the master's web UI
    (``/json/`` lists workers and applications); ``worker_hosts``: the host of worker i
    (what executors on it are started for); ``workdir``: logs, work directories and
    ``cluster.json``; ``pids``: ``"master"``, ``"worker-0"``, ... -> daemon JVM pid."""

    master_url: str
    webui_url: str
    worker_hosts: list[str]
    workdir: Path
    pids: dict[str, int] = field(default_factory=dict)
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    # daemon name -> the command prefix it runs under (a host of its own: bench/netns.py)
    _prefixes: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def state(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's JSON state (``workers``, ``activeapps``, ``completedapps``...);
        raises OSError or ValueError when the master does not answer with JSON."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=timeout) as r:
            state: dict[str, Any] = json.loads(r.read())
            return state

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE; 0 while the master does not answer."""
        try:
            return sum(w.get("state") == "ALIVE" for w in self.state()["workers"])
        except (OSError, ValueError):
            return 0

    def executor_pids(self) -> dict[str, list[int]]:
        """Worker host -> pids of the executor JVMs (CoarseGrainedExecutorBackend) that
        worker launched: the worker JVM's children (psutil)."""
        import psutil

        found: dict[str, list[int]] = {h: [] for h in self.worker_hosts}
        for i, host in enumerate(self.worker_hosts):
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(self.pids[f"worker-{i}"]).children():
                    with contextlib.suppress(psutil.Error):
                        if EXECUTOR_CLASS in child.cmdline():
                            found[host].append(child.pid)
        return found

    def kill_executor(self, host: str) -> int:
        """SIGKILL one executor JVM of the worker on ``host``; returns its pid. Raises
        LookupError when no executor runs there."""
        pids = self.executor_pids().get(host, [])
        if not pids:
            raise LookupError(f"no executor on {host}: {self.executor_pids()}")
        os.kill(pids[0], signal.SIGKILL)
        return pids[0]

    def logs(self, tail: int = 3000) -> str:
        """The last ``tail`` characters of each daemon's log, for error messages."""
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}"
            for log in sorted(self.workdir.glob("*.log"))
        )

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every daemon with its executors (see :func:`stop_process_groups`)."""
        classes = {n: MASTER_CLASS if n == "master" else WORKER_CLASS for n in self.pids}
        stop_process_groups({pid: classes[n] for n, pid in self.pids.items()}, timeout)
        for proc in self._children.values():
            proc.poll()  # reaped already; keeps Popen quiet

    def save(self) -> Path:
        """Write ``cluster.json`` (URLs, hosts, pids) into the workdir; returns its path."""
        doc = {
            "master_url": self.master_url,
            "webui_url": self.webui_url,
            "worker_hosts": self.worker_hosts,
            "pids": self.pids,
        }
        path = self.workdir / STATE_FILE
        path.write_text(json.dumps(doc, indent=2))
        return path

    @classmethod
    def load(cls, workdir: Path) -> StandaloneCluster:
        """The cluster ``save`` described in ``workdir``; raises FileNotFoundError."""
        doc = json.loads((workdir / STATE_FILE).read_text())
        return cls(workdir=workdir, **doc)

    def _spawn(self, name: str, main: str, args: list[str], env: dict[str, str]) -> None:
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    *self._prefixes.get(name, ()),
                    str(spark_home() / "bin" / "spark-class"),
                    main,
                    *args,
                ],
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the JVM, its executors
            )
        self._children[name], self.pids[name] = proc, proc.pid

    def _wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``cond`` every 0.1 s; RuntimeError with the logs when a daemon exits or
        ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while not cond():
            dead = {n: p.returncode for n, p in self._children.items() if p.poll() is not None}
            if dead or time.monotonic() > deadline:
                why = f"daemons exited: {dead}" if dead else f"timed out after {timeout} s"
                raise RuntimeError(f"{what}: {why}\n{self.logs()}")
            time.sleep(0.1)


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True


NETNS_WORKER_PORTS = (7200, 7201)  # a worker's port and web UI port on a host of its own


def _worker_args(
    cluster: StandaloneCluster, i: int, cores: int, memory: str, own_stack: bool = False
) -> list[str]:
    host = cluster.worker_hosts[i]
    work = cluster.workdir / f"work-{i}"
    work.mkdir(exist_ok=True)
    port, webui = NETNS_WORKER_PORTS if own_stack else (free_port(host), free_port(host))
    return [
        *("--host", host, "--port", str(port)),
        *("--webui-port", str(webui)),
        *("--cores", str(cores), "--memory", memory, "--work-dir", str(work)),
        cluster.master_url,
    ]


def start_cluster(
    workdir: Path,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    python_path: Sequence[str] = (),
    timeout: float = 90.0,
    worker_env: Sequence[Mapping[str, str]] = (),
    net: NetHosts | None = None,
) -> StandaloneCluster:
    """Start a master on ``127.0.0.1`` and ``workers`` workers (``cores`` cores and
    ``memory`` each, e.g. ``"1g"``: room for one default executor), each worker on its
    own loopback host (:func:`loopback_hosts`); return when every worker is ALIVE in the
    master's JSON, with ``cluster.json`` written. ``python_path`` goes first on the
    daemons' (and so the executors') ``PYTHONPATH``; ``worker_env[i]`` is added to
    worker i's environment (its executors inherit it: what a host sets in
    ``spark-env.sh``). ``net``: worker i runs on host ``net.hosts[i]``, a network
    namespace of its own (:class:`~dstltree.bench.netns.NetHosts`), the master on the
    bridge's address (``net.gateway``, this process's host: the driver's). Raises
    RuntimeError with the logs (after stopping what started) when a daemon exits or
    ``timeout`` seconds pass."""
    (workdir / "conf").mkdir(parents=True, exist_ok=True)  # SPARK_CONF_DIR: no site conf
    master_host = DRIVER_HOST if net is None else net.gateway
    port, webui_port = free_port(master_host), free_port(master_host)
    hosts = loopback_hosts(workers) if net is None else [net.address(h) for h in net.hosts]
    cluster = StandaloneCluster(
        master_url=f"spark://{master_host}:{port}",
        webui_url=f"http://{master_host}:{webui_port}",
        worker_hosts=hosts[:workers],
        workdir=workdir,
    )
    if net is not None:
        cluster._prefixes = {f"worker-{i}": net.prefix(h) for i, h in enumerate(net.hosts)}
    conf = {"SPARK_CONF_DIR": str(workdir / "conf")}
    try:
        master = ["--host", master_host, "--port", str(port), "--webui-port", str(webui_port)]
        cluster._spawn("master", MASTER_CLASS, master, spark_env(master_host, (), **conf))
        # a worker that finds no master tries again only 5 to 15 s later
        cluster._wait(lambda: _accepts(master_host, port), timeout, "no master")
        for i, host in enumerate(cluster.worker_hosts):
            env = spark_env(host, python_path, **conf)
            env.update(worker_env[i] if i < len(worker_env) else {})
            args = _worker_args(cluster, i, cores, memory, own_stack=net is not None)
            cluster._spawn(f"worker-{i}", WORKER_CLASS, args, env)
        cluster._wait(lambda: cluster.alive_workers() == workers, timeout, "workers not up")
        cluster.save()
    except BaseException:
        cluster.stop()
        raise
    return cluster


cluster_app = typer.Typer(help="A Spark standalone cluster on this machine (development).")


@cluster_app.command("up")
def up(
    workers: int = typer.Option(2, min=1, max=250, help="Workers, one loopback host each."),
    cores: int = typer.Option(1, min=1, help="Cores of each worker."),
    memory: str = typer.Option("1g", help="Memory of each worker (Spark size, e.g. 1g)."),
    workdir: Path = typer.Option(Path(".dstl-cluster"), help="Logs, work dirs, cluster.json."),
    timeout: float = typer.Option(90.0, min=1.0, help="Seconds to wait for the workers."),
) -> None:
    """Start a master and workers in the background.

    Prints the master URL, the web UI, the worker hosts and the pids (JSON).
    dstl cluster down stops them."""
    if (workdir / STATE_FILE).exists():
        raise typer.BadParameter(f"{workdir} holds a cluster: dstl cluster down first")
    try:
        start_cluster(workdir, workers, cores, memory, timeout=timeout)
    except RuntimeError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    typer.echo((workdir / STATE_FILE).read_text())


@cluster_app.command("down")
def down(
    workdir: Path = typer.Option(Path(".dstl-cluster"), help="The folder of dstl cluster up."),
    timeout: float = typer.Option(15.0, min=0.1, help="Seconds from SIGTERM to SIGKILL."),
) -> None:
    """Stop the cluster that dstl cluster up started.

    The cluster of --workdir, by pid: SIGTERM to each daemon's process group,
    SIGKILL after --timeout seconds; then forgets it."""
    try:
        cluster = StandaloneCluster.load(workdir)
    except FileNotFoundError:
        raise typer.BadParameter(f"no {STATE_FILE} in {workdir}") from None
    cluster.stop(timeout)
    (workdir / STATE_FILE).unlink()
    typer.echo(f"stopped {cluster.master_url} ({len(cluster.pids)} daemons)")


def register(app: typer.Typer) -> None:
    """Add ``dstl cluster up|down`` to ``app``."""
    app.add_typer(cluster_app, name="cluster")
