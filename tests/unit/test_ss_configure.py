"""configure()'s Spark settings for the file systems that take RocksDB's SST copies
into the tree (no Spark session: a recording builder)."""

from __future__ import annotations

from typing import Any

import pytest

from dstltree.structured_streaming import configure
from dstltree.structured_streaming.configure import (
    LOCAL_FS_CLASS,
    WRAPPING_FS_CLASS,
    file_system_conf,
)


class Builder:
    """Records ``config(key, value)`` as a SparkSession.Builder keeps its options."""

    def __init__(self, **options: str) -> None:
        self._options: dict[str, Any] = dict(options)

    def config(self, key: str, value: str) -> Builder:
        self._options[key] = value
        return self


def test_file_and_wrapped_schemes() -> None:
    s3a = "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert file_system_conf({"file": "", "s3a": s3a}) == {
        "spark.hadoop.fs.file.impl": LOCAL_FS_CLASS,
        "spark.hadoop.fs.file.impl.disable.cache": "true",
        "spark.hadoop.fs.s3a.impl": WRAPPING_FS_CLASS,
        "spark.hadoop.dstltree.fs.s3a.impl": s3a,
    }
    assert file_system_conf({}) == {}


@pytest.mark.parametrize("bad", [{"s3a": ""}, {"s3/a": "X"}, {"": "X"}, {"fé": "X"}])
def test_bad_schemes_are_refused(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="file_systems"):
        file_system_conf(bad)


def test_configure_sets_manager_file_systems_and_class_paths() -> None:
    b = configure(Builder(**{"spark.driver.extraClassPath": "/opt/x.jar"}), socket="/s.sock")
    o = b._options
    jar = o["spark.jars"]
    assert o["spark.sql.streaming.checkpointFileManagerClass"].endswith("CheckpointFileManager")
    assert o["spark.hadoop.fs.file.impl"] == LOCAL_FS_CLASS
    assert o["spark.driver.extraClassPath"].split(":") == ["/opt/x.jar", jar]
    assert o["spark.executor.extraClassPath"] == jar
    assert o["spark.hadoop.dstltree.bridge.socket"] == "/s.sock"
    none = configure(Builder(), file_systems={})._options
    assert "spark.hadoop.fs.file.impl" not in none
