"""A Spark standalone cluster on this machine, for tests: one master and N workers, each
its own JVM started through pyspark's ``bin/spark-class`` (the classes ``start-master.sh``
and ``start-worker.sh`` run), plus ``spark-submit`` in client mode as users run it.

Each worker stands for a separate host: on Linux every ``127.0.0.x`` is a loopback
address, so worker i binds ``127.0.0.<i+2>`` (``--host`` and ``SPARK_LOCAL_IP``) and the
executors it launches report that address as their host; the master and the driver stay
on ``127.0.0.1``. Where only ``127.0.0.1`` can be bound, every worker uses it.

Every wait is bounded, every process is stopped by its process group (SIGTERM, then
SIGKILL after a timeout), and all logs stay in the cluster's directory; a failed start
raises with them.
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pyspark

from tests.support.demo_run import QUICK, ROOT
from tests.support.waiting import wait_until

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
DRIVER_HOST = "127.0.0.1"
# JVM options for a quick start: the client compiler only and a small serial GC
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

__all__ = [
    "DRIVER_HOST",
    "QUICK_JVM",
    "SPARK_HOME",
    "StandaloneCluster",
    "free_port",
    "loopback_hosts",
    "run_demo_on",
    "standalone_cluster",
    "submit",
    "submit_conf",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bound to port 0, then closed)."""
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


def _spark_env(local_ip: str, **extra: str) -> dict[str, str]:
    """Environment of a Spark JVM or ``spark-submit``: our Python for every Python
    process, this checkout first on ``PYTHONPATH``, and ``local_ip`` as the address
    Spark binds and advertises."""
    env = dict(os.environ)
    path = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP=local_ip,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(dict.fromkeys(path)),
        SPARK_DAEMON_MEMORY="512m",
        # the master's REST submission server would take the fixed port 6066
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        # the daemons only route messages: a quick JIT and a small GC start them sooner
        SPARK_DAEMON_JAVA_OPTS=QUICK_JVM,
    )
    env.update(extra)
    return env


def _stop_group(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM the process group of ``proc`` (its own session), SIGKILL it after
    ``timeout`` seconds; the group holds the JVM and every process it started."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # executors left behind in the group
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class StandaloneCluster:
    """A running master and its workers.

    ``master_url``: ``spark://127.0.0.1:<port>``; ``webui_url``: the master's web UI
    (``/json/`` lists workers and applications); ``worker_hosts``: the address of worker
    i (what executors on it report as their host); ``workdir``: logs (``*.log``) and the
    workers' work directories (``work-<i>``)."""

    master_url: str
    webui_url: str
    worker_hosts: list[str]
    workdir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def pids(self) -> dict[str, int]:
        """Process id of each daemon JVM: ``"master"``, ``"worker-0"``, ``"worker-1"``..."""
        return {name: p.pid for name, p in self.processes.items()}

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
        """Worker host -> process ids of the executor JVMs (CoarseGrainedExecutorBackend)
        that worker launched, found among the worker JVM's children (psutil)."""
        found: dict[str, list[int]] = {h: [] for h in self.worker_hosts}
        for i, host in enumerate(self.worker_hosts):
            with contextlib.suppress(psutil.NoSuchProcess):
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
        """The last ``tail`` characters of each daemon's log, for failure messages."""
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the workers, then the master (process groups, SIGTERM then SIGKILL)."""
        for name in sorted(self.processes, key=lambda n: n == "master"):
            _stop_group(self.processes[name], timeout)

    def _spawn(self, name: str, cls: str, args: list[str], local_ip: str) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [str(SPARK_CLASS), cls, *args],
            env=_spark_env(local_ip, SPARK_CONF_DIR=str(self.workdir / "conf")),
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and its executors
        )
        log.close()

    def _check_running(self) -> bool:
        dead = {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}
        assert not dead, f"Spark daemons exited: {dead}\n{self.logs()}"
        return True


def _start_master(cluster: StandaloneCluster, port: int, webui_port: int) -> None:
    args = ["--host", DRIVER_HOST, "--port", str(port), "--webui-port", str(webui_port)]
    cluster._spawn("master", MASTER_CLASS, args, DRIVER_HOST)


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _wait_listening(cluster: StandaloneCluster, host: str, port: int, timeout: float) -> None:
    try:
        wait_until(
            lambda: cluster._check_running() and _accepts(host, port),
            timeout=timeout,
            interval=0.1,
        )
    except AssertionError as e:
        raise AssertionError(f"{e}: no master on {host}:{port}\n{cluster.logs()}") from e


def _start_worker(cluster: StandaloneCluster, i: int, cores: int, memory: str) -> None:
    host = cluster.worker_hosts[i]
    work = cluster.workdir / f"work-{i}"
    work.mkdir()
    args = [
        *("--host", host, "--port", str(free_port(host))),
        *("--webui-port", str(free_port(host))),
        *("--cores", str(cores), "--memory", memory, "--work-dir", str(work)),
        cluster.master_url,
    ]
    cluster._spawn(f"worker-{i}", WORKER_CLASS, args, host)


@contextlib.contextmanager
def standalone_cluster(
    tmp_path: Path,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    timeout: float = 90.0,
) -> Iterator[StandaloneCluster]:
    """A master on ``127.0.0.1`` and ``workers`` workers (``cores`` cores and ``memory``
    each, e.g. ``"1g"``: one default executor per worker), up when every worker is ALIVE
    in the master's JSON; stopped on exit. Logs in ``tmp_path/standalone``. Raises
    AssertionError (with the logs) when a daemon exits or the workers are not all
    registered within ``timeout`` seconds."""
    workdir = tmp_path / "standalone"
    (workdir / "conf").mkdir(parents=True)
    port, webui_port = free_port(DRIVER_HOST), free_port(DRIVER_HOST)
    cluster = StandaloneCluster(
        master_url=f"spark://{DRIVER_HOST}:{port}",
        webui_url=f"http://{DRIVER_HOST}:{webui_port}",
        worker_hosts=loopback_hosts(workers),
        workdir=workdir,
    )
    try:
        _start_master(cluster, port, webui_port)
        # a worker that finds no master retries only 5 to 15 s later
        _wait_listening(cluster, DRIVER_HOST, port, timeout)
        for i in range(workers):
            _start_worker(cluster, i, cores, memory)
        try:
            wait_until(
                lambda: cluster._check_running() and cluster.alive_workers() == workers,
                timeout=timeout,
                interval=0.2,
            )
        except AssertionError as e:
            raise AssertionError(f"{e}: standalone cluster not up\n{cluster.logs()}") from e
        yield cluster
    finally:
        cluster.stop()


def submit_conf(
    cluster: StandaloneCluster, conf: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Spark properties of an application on ``cluster``: the driver on ``127.0.0.1``,
    our Python and this checkout in the executors, no application web UI, quick barrier
    slot checks; ``conf`` entries win."""
    python_path = _spark_env(DRIVER_HOST)["PYTHONPATH"]
    base = {
        "spark.driver.host": DRIVER_HOST,
        "spark.driver.bindAddress": DRIVER_HOST,
        "spark.ui.enabled": "false",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.executorEnv.PYTHONPATH": python_path,
        "spark.pyspark.python": sys.executable,
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
        # quick JVM starts on a small machine: executors start in seconds, not 10+
        "spark.driver.extraJavaOptions": QUICK_JVM,
        "spark.executor.extraJavaOptions": QUICK_JVM,
    }
    return {**base, **(conf or {})}


def submit(
    cluster: StandaloneCluster,
    args: Sequence[str],
    conf: Mapping[str, str] | None = None,
    timeout: float = 180.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``spark-submit --master <cluster> --deploy-mode client <args>`` (``args[0]`` a
    Python file, the rest its arguments) with :func:`submit_conf` properties; returns the
    finished process (text stdout and stderr, any exit code). Raises
    subprocess.TimeoutExpired after ``timeout`` seconds."""
    props = [x for k, v in submit_conf(cluster, conf).items() for x in ("--conf", f"{k}={v}")]
    cmd = [str(SPARK_SUBMIT), "--master", cluster.master_url, "--deploy-mode", "client"]
    return subprocess.run(
        [*cmd, *props, *args],
        cwd=ROOT,
        env=_spark_env(DRIVER_HOST),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- for the demo-on-standalone test: the main job submitted to this cluster -------------
def run_demo_on(cluster: StandaloneCluster, tmp_path: Path, *args: str) -> dict[str, Any]:
    """The JSON report of ``python -m dstltree.cli.app demo --master <cluster>`` run in a
    subprocess from the repository root, in the quick mode of the end-to-end tests
    (tests/support/demo_run.py), its checkpoints under ``tmp_path/dfs``; ``args`` come
    last (later flags win). The driver runs on ``127.0.0.1`` with our Python in the
    executors. Fails the test with the command's stderr and the cluster's logs when it
    exits non-zero; raises subprocess.TimeoutExpired after 420 s."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "dstltree.cli.app", "demo", "--master", cluster.master_url]
    cmd += ["--base-path", str(tmp_path / "dfs"), "--report", str(report), *QUICK, *args]
    started = time.monotonic()
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=_spark_env(DRIVER_HOST),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, (
        f"demo exited {proc.returncode} after {time.monotonic() - started:.0f} s\n"
        f"{proc.stderr[-4000:]}\n{cluster.logs()}"
    )
    result: dict[str, Any] = json.loads(report.read_text())
    return result
