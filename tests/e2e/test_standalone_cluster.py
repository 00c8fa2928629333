"""A real Spark standalone cluster (tests/support/standalone.py): a master and two workers,
each its own JVM on its own loopback address standing for a host, and applications sent
with ``spark-submit --deploy-mode client`` as users send them (one cluster for these);
and ``dstl cluster up`` / ``down``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.demo_run import ROOT
from tests.support.standalone import (
    DRIVER_HOST,
    StandaloneCluster,
    standalone_cluster,
    submit,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.standalone, pytest.mark.spark, pytest.mark.slow]

# A barrier stage of 2 tasks; each returns where it ran: its address in the barrier's task
# infos, the host its executor JVM was started for (``--hostname``, the worker's
# ``--host``), that JVM's pid and the task's SPARK_LOCAL_IP. With a hold folder, each
# task's first attempt marks itself started there and then waits for ``release``; a task
# that finds its mark is a retry. Spark does not retry a failed barrier result stage
# ("Could not recover from a failed barrier ResultStage"): the driver runs the job again,
# as dstltree's driver does, up to 3 times.
BARRIER_SCRIPT = """
import json, os, sys
import psutil
from pyspark import BarrierTaskContext
from pyspark.sql import SparkSession
from tests.support.demo_run import ROOT
from tests.support.waiting import wait_until

HOLD = sys.argv[1] if len(sys.argv) > 1 else None
EXECUTOR = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def task(_):
    ctx = BarrierTaskContext.get()
    ctx.barrier()
    started = os.path.join(HOLD or "", f"started-{ctx.partitionId()}")
    retried = bool(HOLD) and os.path.exists(started)
    if HOLD and not retried:
        open(started, "w").close()
        wait_until(lambda: os.path.exists(os.path.join(HOLD, "release")), timeout=60)
    jvm = next(p for p in psutil.Process().parents() if EXECUTOR in p.cmdline())
    args = jvm.cmdline()
    yield {
        "partition": ctx.partitionId(),
        "retried": retried,
        "address": ctx.getTaskInfos()[ctx.partitionId()].address,
        "host": args[args.index("--hostname") + 1],
        "local_ip": os.environ.get("SPARK_LOCAL_IP"),
        "executor_pid": jvm.pid,
    }


spark = SparkSession.builder.appName("barrier-hosts").getOrCreate()
sc = spark.sparkContext
for job in range(3):
    try:
        rows = sc.parallelize(range(2), 2).barrier().mapPartitions(task).collect()
        break
    except Exception as e:
        if job == 2:
            raise
        print(f"job {job} failed: {str(e)[:300]}", file=sys.stderr)
executors = [e.host() for e in sc._jsc.sc().statusTracker().getExecutorInfos()]
driver = sc.getConf().get("spark.driver.host")
result = {"rows": rows, "driver_host": driver, "executors": executors, "jobs": job + 1}
print("RESULT " + json.dumps(result))
spark.stop()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), workers=2) as c:
        if len(set(c.worker_hosts)) < 2:
            pytest.skip("this OS binds only 127.0.0.1: workers cannot stand for two hosts")
        yield c


def _result(proc: Any, cluster: StandaloneCluster) -> dict[str, Any]:
    assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n{cluster.logs()}"
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def _hosts(result: dict[str, Any]) -> list[str]:
    return sorted(r["host"] for r in result["rows"])


def _script(tmp_path: Path) -> str:
    script = tmp_path / "barrier_hosts.py"
    script.write_text(BARRIER_SCRIPT)
    return str(script)


def test_two_workers_on_two_hosts_take_one_barrier_task_each(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    state = cluster.state()
    assert sorted(w["host"] for w in state["workers"]) == ["127.0.0.2", "127.0.0.3"]
    assert cluster.master_url.startswith(f"spark://{DRIVER_HOST}:")
    assert len(set(cluster.pids.values())) == 3

    result = _result(submit(cluster, [_script(tmp_path)]), cluster)

    assert result["driver_host"] == DRIVER_HOST
    assert _hosts(result) == ["127.0.0.2", "127.0.0.3"]
    assert all(r["local_ip"] == r["host"] for r in result["rows"])
    # the driver knows the executors by the hosts their workers registered with
    assert sorted(result["executors"]) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    # the barrier's task infos give each executor's connection to the driver as the
    # driver sees it (executors run no RPC server): one address per executor, but with
    # the connection's source address and port: 127.0.0.1 on loopback, not the host the
    # executor was started for
    assert len({r["address"] for r in result["rows"]}) == 2
    assert {r["address"].rsplit(":", 1)[0] for r in result["rows"]} == {DRIVER_HOST}
    assert not any(r["retried"] for r in result["rows"]) and result["jobs"] == 1
    assert len({r["executor_pid"] for r in result["rows"]}) == 2


@pytest.mark.timeout(420)
def test_an_executor_killed_mid_stage_is_replaced_and_the_stage_retried(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(submit, cluster, [_script(tmp_path), str(hold)], timeout=360)
        started = [hold / "started-0", hold / "started-1"]
        # a driver and two executor JVMs start first: over 60 s when another test suite
        # loads the machine (measured); the submission's own limit is 360 s
        wait_until(lambda: running.done() or all(p.exists() for p in started), timeout=170)
        assert not running.done(), running.result().stderr[-4000:]
        before = cluster.executor_pids()
        assert all(len(pids) == 1 for pids in before.values()), before
        killed = cluster.kill_executor("127.0.0.2")
        (hold / "release").touch()  # a task of the failed attempt still running ends now
        result = _result(running.result(timeout=360), cluster)

    assert _hosts(result) == ["127.0.0.2", "127.0.0.3"]
    assert result["jobs"] == 2  # the whole barrier stage again, in a second job
    assert all(r["retried"] for r in result["rows"])
    on_killed_host = next(r for r in result["rows"] if r["host"] == "127.0.0.2")
    assert on_killed_host["executor_pid"] not in (None, killed)
    print(f"killed executor {killed}, before {before}", file=sys.stderr)


def _dstl(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dstltree.cli.app", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cluster_command_starts_and_stops_the_daemons(tmp_path: Path) -> None:
    workdir = str(tmp_path / "c")
    up = _dstl("cluster", "up", "--workers", "1", "--workdir", workdir)
    assert up.returncode == 0, up.stderr[-4000:]
    try:
        doc = json.loads(up.stdout)
        assert doc["master_url"].startswith(f"spark://{DRIVER_HOST}:")
        assert set(doc["pids"]) == {"master", "worker-0"}
        assert all(psutil.pid_exists(p) for p in doc["pids"].values())
        again = _dstl("cluster", "up", "--workdir", workdir)
        assert again.returncode != 0 and "dstl cluster down first" in again.stderr
    finally:
        down = _dstl("cluster", "down", "--workdir", workdir)
    assert down.returncode == 0, down.stderr[-4000:]
    assert not any(psutil.pid_exists(p) for p in doc["pids"].values())
    assert _dstl("cluster", "down", "--workdir", workdir).returncode != 0
