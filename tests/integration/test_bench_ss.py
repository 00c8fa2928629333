"""``dstl bench structured-streaming`` run tiny (3 batches, 4 shuffle partitions, no
latency): one row per engine with the table's columns, Spark alone writes changelog
files under its checkpoint, the tree run none (and objects in the tree instead). The
jar's LatencyFileSystem serves ``latency:`` paths, counts requests by kind and samples
the same inverse CDF as ``topology.latency``. No timing assertions."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstltree.bench.structured_streaming import SsBenchSettings, latency_conf, run_ss_bench
from dstltree.cli.app import app
from dstltree.cli.commands._structured_streaming import COLUMNS, table_rows
from dstltree.topology.latency import get_model


@pytest.mark.spark
def test_tiny_bench_table_and_no_changelog_files_in_the_tree_run(tmp_path: Path) -> None:
    settings = SsBenchSettings(
        partitions=(4,), batches=3, rows=50, keys=10, cores=2, timeout_s=300.0
    )
    runs = run_ss_bench(settings, work=tmp_path)
    assert [(r.engine, r.partitions) for r in runs] == [("spark", 4), ("tree", 4), ("dstl", 4)]
    for r in runs:
        assert r.figures.batches == 3 and r.figures.rows == 150
    spark, tree, dstl = runs
    assert spark.figures.checkpoint_files > 0 and tree.figures.checkpoint_files > 0
    assert spark.figures.changelog_files >= 3 * 4  # one per partition per batch
    assert spark.tree_objects == 0
    assert tree.figures.changelog_files == 0
    assert tree.tree_objects >= 1
    assert tree.figures.checkpoint_files < spark.figures.checkpoint_files
    # a dstl:// location: no file outside the tree, each batch waited for 2 PUTs at
    # most after the first (the offsets with the sources' log, the commit with state)
    assert dstl.figures.checkpoint_files == 0 and dstl.tree_objects >= 3
    assert sorted(dstl.critical_puts) == list(range(3))
    assert all(n <= 2 for b, n in dstl.critical_puts.items() if b > 0), dstl.critical_puts
    assert dstl.critical_per_batch is not None and tree.critical_per_batch is None
    rows = table_rows(runs)
    assert [len(row) for row in rows] == [len(COLUMNS)] * 3
    assert [row[0] for row in rows] == ["spark", "tree", "dstl"]


@pytest.mark.spark
def test_latency_file_system_counts_requests_and_matches_the_model(tmp_path: Path) -> None:
    from dstltree.bench.structured_streaming import _builder

    settings = SsBenchSettings(partitions=(1,), dfs_model="flip158-s3", scale=0.001)
    spark = _builder(settings, 1).getOrCreate()
    try:
        jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
        for k, v in latency_conf("flip158-s3", 0.001).items():  # a JVM started earlier
            conf.set(k.removeprefix("spark.hadoop."), v)
        fs_cls = jvm.io.dstltree.spark.LatencyFileSystem
        path = jvm.org.apache.hadoop.fs.Path(f"latency:{tmp_path / 'a' / 'f.bin'}")
        fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(path.toUri(), conf)  # uncached
        puts, gets = fs_cls.requests("put"), fs_cls.requests("get")
        out = fs.create(path, True)
        out.write(bytearray(b"x" * 100))
        out.close()
        assert (tmp_path / "a" / "f.bin").read_bytes() == b"x" * 100
        assert not list(tmp_path.rglob("*.crc"))  # an object store has no checksum files
        fs.open(path).close()
        assert [s.getPath().getName() for s in fs.listStatus(path.getParent())] == ["f.bin"]
        assert fs_cls.requests("put") == puts + 1 and fs_cls.requests("get") == gets + 1
        model = get_model("flip158-s3").scaled(0.001)
        for pct in (0.0, 10.0, 50.0, 95.0, 99.95, 100.0):
            for size in (0, 1000, 5_000_000, 50_000_000):
                assert fs.quantile(pct, size) == pytest.approx(model.quantile(pct, size))
        fs.close()
    finally:
        spark.stop()


def test_cli_refuses_bad_options() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["bench", "structured-streaming", "--dfs-model", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.output
    bad = runner.invoke(app, ["bench", "structured-streaming", "--partitions", "4,x"])
    assert bad.exit_code == 2
    bad = runner.invoke(app, ["bench", "structured-streaming", "--engines", "flink"])
    assert bad.exit_code == 2
