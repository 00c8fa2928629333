"""Building the Spark session for the job (quiet logs, our Python; loopback for local
masters, the configured addresses for a cluster) and the driver's addresses."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG4J = Path(__file__).with_name("log4j2.properties")


def spark_session(master: str, app: str = "dstltree", driver_host: str | None = None) -> Any:
    """A SparkSession on ``master`` (``local[N]``, ``local-cluster[E,C,M]``,
    ``spark://host:port`` or any other classic-mode master), with task failures failing
    the stage at once (the job restarts the stage itself, so that every task restores
    from the latest completed checkpoint) and quiet logs.

    Addresses: local masters are bound to 127.0.0.1. For a cluster master the driver's
    host is ``driver_host``, else ``SPARK_LOCAL_IP``, else whatever the Spark
    configuration says (``spark.driver.host`` from spark-submit or spark-defaults.conf,
    else Spark's default); executors keep their own addresses."""
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    host = driver_host or os.environ.get("SPARK_LOCAL_IP") or None
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.task.maxFailures", "1")
        .config("spark.stage.maxConsecutiveAttempts", "1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.python.task.killTimeout", "2s")
    )
    if host:
        builder = builder.config("spark.driver.host", host)
        builder = builder.config("spark.driver.bindAddress", host)
    if local:
        builder = builder.config("spark.executorEnv.SPARK_LOCAL_IP", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def driver_addresses(spark: Any) -> tuple[str, str | None]:
    """(bind endpoint for the driver's sockets, host executors reach the driver at)
    from the session's ``spark.driver.bindAddress`` and ``spark.driver.host``: e.g.
    ``("tcp://0.0.0.0:*", "10.0.0.5")`` (every interface when only the host is set);
    loopback when neither is set."""
    conf = spark.sparkContext.getConf()
    host = conf.get("spark.driver.host", None)
    bind = conf.get("spark.driver.bindAddress", None) or ("0.0.0.0" if host else "127.0.0.1")
    return f"tcp://{bind}:*", host


def executor_count(master: str) -> int:
    """Executors of a local-cluster master (from its spec), else 1."""
    if master.startswith("local-cluster["):
        return int(master[len("local-cluster[") :].split(",")[0])
    return 1


def executor_host(task_address: str | None = None) -> str:
    """The host of the executor this Python worker serves, as its worker names it:
    ``SPARK_LOCAL_IP`` (passed from worker to executor to Python worker where set),
    else the executor JVM's ``--hostname`` argument, else the host part of the task's
    address ``host:port`` (which is the executor's address as the driver sees its
    connection: the loopback address on one machine), else 127.0.0.1."""
    env = os.environ.get("SPARK_LOCAL_IP", "").strip()
    if env:
        return env
    jvm = _executor_hostname_arg()
    if jvm:
        return jvm
    if task_address:
        return task_address.rsplit(":", 1)[0] if ":" in task_address else task_address
    return "127.0.0.1"


def executor_jvm() -> Any:
    """The JVM above this Python worker (a ``psutil.Process``: the executor's, or the
    driver's in local mode), or None when there is none or it cannot be seen."""
    try:
        import psutil

        p = psutil.Process().parent()
        while p is not None:
            if "java" in p.name():
                return p
            p = p.parent()
    except Exception:  # noqa: BLE001 - best effort: callers fall back
        return None
    return None


def _executor_hostname_arg() -> str | None:
    """``--hostname`` of the CoarseGrainedExecutorBackend above this process, if any."""
    jvm = executor_jvm()
    try:
        args = [] if jvm is None else jvm.cmdline()
    except Exception:  # noqa: BLE001 - the process went away: the caller falls back
        return None
    if any("CoarseGrainedExecutorBackend" in a for a in args) and "--hostname" in args:
        i = args.index("--hostname")
        return args[i + 1] if i + 1 < len(args) else None
    return None
