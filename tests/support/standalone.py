"""A Spark standalone cluster for tests (the one ``dstl cluster up`` starts,
dstltree/cli/commands/cluster.py): a master on ``127.0.0.1`` and workers on their own
loopback hosts, with this checkout on the executors' ``PYTHONPATH``; plus
``spark-submit`` in client mode as users run it, and the main job run against it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dstltree.cli.commands.cluster import (
    DRIVER_HOST,
    QUICK_JVM,
    StandaloneCluster,
    spark_env,
    spark_home,
    start_cluster,
)
from tests.support.demo_run import QUICK, ROOT

__all__ = [
    "DRIVER_HOST",
    "StandaloneCluster",
    "run_demo_on",
    "start_submit",
    "standalone_cluster",
    "submit",
    "submit_conf",
]


@contextlib.contextmanager
def standalone_cluster(
    tmp_path: Path,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    timeout: float = 90.0,
    worker_env: Sequence[Mapping[str, str]] = (),
) -> Iterator[StandaloneCluster]:
    """A running cluster (``start_cluster``) in ``tmp_path/standalone``: ``workers``
    workers of ``cores`` cores and ``memory`` each, this checkout first on their
    ``PYTHONPATH``, ``worker_env[i]`` in worker i's environment; stopped on exit.
    Raises RuntimeError with the daemons' logs when it does not come up within
    ``timeout`` seconds."""
    cluster = start_cluster(
        tmp_path / "standalone",
        workers,
        cores,
        memory,
        python_path=[str(ROOT)],
        timeout=timeout,
        worker_env=worker_env,
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def submit_conf(
    cluster: StandaloneCluster, conf: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Spark properties of an application on ``cluster``: the driver on ``127.0.0.1``,
    our Python and this checkout in the executors, no application web UI, barrier slot
    checks every second, quick JVM starts; ``conf`` entries win."""
    base = {
        "spark.driver.host": DRIVER_HOST,
        "spark.driver.bindAddress": DRIVER_HOST,
        "spark.ui.enabled": "false",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.executorEnv.PYTHONPATH": _env()["PYTHONPATH"],
        "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
        "spark.driver.extraJavaOptions": QUICK_JVM,
        "spark.executor.extraJavaOptions": QUICK_JVM,
    }
    return {**base, **(conf or {})}


def _env() -> dict[str, str]:
    return spark_env(DRIVER_HOST, [str(ROOT)])


def submit_command(
    cluster: StandaloneCluster, args: Sequence[str], conf: Mapping[str, str] | None = None
) -> list[str]:
    """``spark-submit --master <cluster> --deploy-mode client <conf> <args>``."""
    props = [x for k, v in submit_conf(cluster, conf).items() for x in ("--conf", f"{k}={v}")]
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url]
    return [*cmd, "--deploy-mode", "client", *props, *args]


def submit(
    cluster: StandaloneCluster,
    args: Sequence[str],
    conf: Mapping[str, str] | None = None,
    timeout: float = 180.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``spark-submit --master <cluster> --deploy-mode client <args>`` from the
    repository root (``args[0]`` a Python file, the rest its arguments) with
    :func:`submit_conf` properties; returns the finished process (text stdout and
    stderr, any exit code). Raises subprocess.TimeoutExpired after ``timeout`` seconds."""
    return subprocess.run(
        submit_command(cluster, args, conf),
        cwd=ROOT,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_submit(
    cluster: StandaloneCluster,
    args: Sequence[str],
    log: Path,
    conf: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """:func:`submit` without waiting: the running ``spark-submit`` (its own process
    group, output to ``log``). The caller waits for it with a timeout and stops it by
    PID."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            submit_command(cluster, args, conf),
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# --- for the demo-on-standalone test: the main job run against this cluster --------------
def run_demo_on(cluster: StandaloneCluster, tmp_path: Path, *args: str) -> dict[str, Any]:
    """The JSON report of ``python -m dstltree.cli.app demo --master <cluster>`` run in a
    subprocess from the repository root, in the quick mode of the end-to-end tests
    (tests/support/demo_run.py), its data under ``tmp_path/dfs``; ``args`` come last
    (later flags win). The driver binds ``127.0.0.1`` (SPARK_LOCAL_IP); executors run
    our Python. Fails the test with the command's stderr and the cluster's logs when it
    exits non-zero; raises subprocess.TimeoutExpired after 420 s."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "dstltree.cli.app", "demo", "--master", cluster.master_url]
    cmd += ["--base-path", str(tmp_path / "dfs"), "--report", str(report), *QUICK, *args]
    started = time.monotonic()
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=_env(),
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
