"""Building the Spark session for the job: loopback only, quiet logs, our Python."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG4J = Path(__file__).with_name("log4j2.properties")


def spark_session(master: str, app: str = "dstltree") -> Any:
    """A SparkSession on ``master`` (``local[N]`` or ``local-cluster[E,C,M]``) bound to
    127.0.0.1, with task failures failing the job at once (the job restarts the stage
    itself, so that every task restores from the latest completed checkpoint)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.task.maxFailures", "1")
        .config("spark.stage.maxConsecutiveAttempts", "1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.executorEnv.SPARK_LOCAL_IP", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.python.task.killTimeout", "2s")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def executor_count(master: str) -> int:
    """Executors of a local-cluster master (from its spec), else 1."""
    if master.startswith("local-cluster["):
        return int(master[len("local-cluster[") :].split(",")[0])
    return 1
