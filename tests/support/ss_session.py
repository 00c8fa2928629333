"""Spark sessions for the Structured Streaming tests: quiet, loopback, our Python, the
log4j settings of the job's sessions, set up through ``configure(...)``."""

from __future__ import annotations

import os
import sys
from typing import Any

from dstltree.sparkplug.spark_session import LOG4J
from dstltree.structured_streaming import configure


def ss_builder(master: str = "local[4]", partitions: int = 4) -> Any:
    """A SparkSession.Builder on ``master`` with ``partitions`` shuffle partitions."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    return (
        SparkSession.builder.master(master)
        .appName("dstltree-ss-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )


def ss_session(master: str = "local[4]", partitions: int = 4, **kw: Any) -> Any:
    """A new SparkSession set up by ``configure(builder, **kw)``."""
    spark = configure(ss_builder(master, partitions), **kw).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
