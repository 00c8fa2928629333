"""FileSource on real files: parquet, csv and json lines in a temporary directory, under
``memory://`` and on the moto S3 server; resuming from every offset, discovery, the
``_SUCCESS`` marker, exactly-once across a simulated failure, errors naming file and
row, null values."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstltree.sparkplug.sources import FileSource, SourceError, Split, list_files
from dstltree.sparkplug.sources import formats as formats_module
from tests.support.s3_server import S3Target
from tests.support.source_driver import SourceDriver

pytestmark = pytest.mark.timeout(120)
EXT = {"parquet": "parquet", "csv": "csv", "json": "jsonl"}


def _rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"id": i, "name": f"n{i}", "score": None if i % 3 == 1 else i / 4}
        for i in range(start, start + n)
    ]


def _write(url: str, fmt: str, rows: list[dict[str, Any]], **opts: Any) -> None:
    """Writes ``rows`` at ``url`` in ``fmt`` (no rows: an empty file, parquet with a
    schema)."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    table = pa.Table.from_pylist(rows, schema=schema if not rows else None)
    with fsspec.open(url, "wb", **opts) as f:
        if not rows and fmt != "parquet":
            pass
        elif fmt == "parquet":
            pq.write_table(table, f, row_group_size=opts.get("row_group_size", 4))
        elif fmt == "csv":
            pa_csv.write_csv(table, f)
        else:
            f.write("".join(json.dumps(r) + "\n" for r in rows).encode())


@pytest.fixture(params=["local", "memory"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "in")
        return
    url = f"memory://sources-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def _read_all(src: FileSource, parallelism: int = 2) -> list[dict[str, Any]]:
    driver = SourceDriver(pickle.loads(pickle.dumps(src)), parallelism)
    driver.run_to_end()
    return driver.output


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_round_trip(base: str, fmt: str) -> None:
    files = {"b": _rows(5, 10), "a": _rows(9), "c": _rows(0)}
    for name, rows in files.items():
        _write(f"{base}/{name}.{EXT[fmt]}", fmt, rows)
    fsspec.open(f"{base}/_SUCCESS", "wb").open().close()
    out = _read_all(FileSource(base, fmt), parallelism=1)
    assert out == files["a"] + files["b"]  # one reader: files in name order


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_parquet_resumes_at_every_offset_skipping_row_groups(
    tmp_path: Path, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.parquet"
    rows = _rows(23)
    if not path.exists():
        _write(str(path), "parquet", rows, row_group_size=5)
    offset = data.draw(st.integers(0, 23))
    asked: list[list[int]] = []
    iter_batches = pq.ParquetFile.iter_batches

    def spy(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        asked.append(list(kwargs["row_groups"]))
        return iter_batches(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(pq.ParquetFile, "iter_batches", spy)
        reader = FileSource(str(tmp_path)).create_reader()
        assert list(reader.read(Split("p", str(path)), offset)) == rows[offset:]
    assert asked == ([] if offset == 23 else [list(range(offset // 5, 5))])


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_text_formats_resume_at_every_offset_across_blocks(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(formats_module, "BLOCK_BYTES", 64)  # several batches
    path = tmp_path / f"f.{EXT[fmt]}"
    rows = _rows(30)
    _write(str(path), fmt, rows)
    reader = FileSource(str(tmp_path), fmt).create_reader()
    for offset in range(31):
        assert list(reader.read(Split("f", str(path)), offset)) == rows[offset:], offset
    with pytest.raises(SourceError, match="offset 31 is past the end \\(30 records\\)"):
        list(reader.read(Split("f", str(path)), 31))


def test_gzip_csv_is_decompressed_by_name(tmp_path: Path) -> None:
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b"x,y\n1,a\n2,b\n"))
    reader = FileSource(str(tmp_path), "csv").create_reader()
    out = list(reader.read(Split("a", str(tmp_path / "a.csv.gz")), 1))
    assert out == [{"x": 2, "y": "b"}]


def test_discovery_in_name_order_ignoring_hidden_files(base: str) -> None:
    src = FileSource(base, "csv")
    enum = src.create_enumerator()
    assert enum.discover() == []  # the directory does not exist yet
    _write(f"{base}/b.csv", "csv", _rows(2))
    assert [s.id for s in enum.discover()] == ["b.csv"]
    for name in ("c.csv", "a.csv", "_c.csv", ".a.csv", "_temporary/0/x.csv", "day=2/z.csv"):
        _write(f"{base}/{name}", "csv", _rows(1))
    new = enum.discover()
    assert [s.id for s in new] == ["a.csv", "c.csv", "day=2/z.csv"]
    assert new[0].location.endswith("/a.csv") and "://" in new[0].location
    assert enum.discover() == []


def test_success_marker_ends_discovery_after_files_listed_before_it(base: str) -> None:
    src = FileSource(base, "json")
    driver = SourceDriver(src, 2)
    _write(f"{base}/1.jsonl", "json", _rows(3))
    driver.poll()
    assert not driver.enumerator.is_finished()
    _write(f"{base}/2.jsonl", "json", _rows(3, 3))
    fsspec.open(f"{base}/_SUCCESS", "wb").open().close()
    driver.poll()
    assert not driver.enumerator.is_finished()  # 1 and 2 are assigned, not consumed
    _write(f"{base}/3.jsonl", "json", _rows(3, 6))  # after the marker: not read
    driver.run_to_end()
    assert sorted(r["id"] for r in driver.output) == list(range(6))
    assert driver.enumerator.snapshot().finished == {"1.jsonl", "2.jsonl"}


def test_single_file_url_is_one_complete_split(tmp_path: Path) -> None:
    _write(str(tmp_path / "only.parquet"), "parquet", _rows(6))
    src = FileSource(str(tmp_path / "only.parquet"))
    assert _read_all(src) == _rows(6)


def test_restore_mid_way_reads_every_record_once(tmp_path: Path) -> None:
    base = str(tmp_path)
    files = {f"part-{i}.parquet": _rows(7 + i, 100 * i) for i in range(5)}
    for name, rows in files.items():
        _write(f"{base}/{name}", "parquet", rows, row_group_size=3)
    src = FileSource(base)
    first = SourceDriver(src, 3)
    first.poll()
    first.step(0, 9)  # part-0 done (7), 2 records of part-3
    first.step(1, 4)
    (tmp_path / "_SUCCESS").touch()
    first.poll()
    cp = first.checkpoint()
    first.step(2, 5)  # lost with the failure
    restored = cp.restored()
    assert restored.finished == {"part-0.parquet"}
    assert {s.split.id: s.offset for s in restored.pending} == {
        "part-1.parquet": 4,
        "part-2.parquet": 0,
        "part-3.parquet": 2,
        "part-4.parquet": 0,
    }
    second = SourceDriver(src, 2, restored)
    second.run_to_end()
    out = cp.output + second.output
    assert sorted(r["id"] for r in out) == sorted(r["id"] for rows in files.values() for r in rows)


def test_corrupt_parquet_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet at all PAR1")
    reader = FileSource(str(tmp_path)).create_reader()
    with pytest.raises(SourceError) as e:
        list(reader.read(Split("bad.parquet", str(tmp_path / "bad.parquet")), 0))
    assert e.value.path.endswith("bad.parquet") and e.value.row is None
    assert "bad.parquet:" in str(e.value)


def test_truncated_parquet_names_the_file(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    _write(str(good), "parquet", _rows(10))
    (tmp_path / "cut.parquet").write_bytes(good.read_bytes()[:-20])
    reader = FileSource(str(tmp_path)).create_reader()
    with pytest.raises(SourceError, match="cut.parquet"):
        list(reader.read(Split("cut", str(tmp_path / "cut.parquet")), 0))


@pytest.mark.parametrize(
    ("fmt", "text", "row", "message"),
    [
        ("csv", "a,b\n1,2\n3,4\n5,6,7\n8,9\n", 2, "Expected 2 columns, got 3"),
        ("json", '{"a": 1}\n{"a": 2}\n{"a": 3}\n{"a": oops}\n', 3, "JSON parse error"),
    ],
)
def test_malformed_line_names_file_and_row(
    tmp_path: Path, fmt: str, text: str, row: int, message: str
) -> None:
    path = tmp_path / f"bad.{EXT[fmt]}"
    path.write_text(text)
    reader = FileSource(str(tmp_path), fmt).create_reader()
    got: list[dict[str, Any]] = []
    with pytest.raises(SourceError, match=message) as e:
        got.extend(reader.read(Split("bad", str(path)), 0))
    assert e.value.row == row
    assert str(e.value).startswith(f"{path}, row {row}: ")
    assert len(got) < row + 1  # nothing past the bad line came out


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_bad_value_in_a_later_block_names_its_row(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(formats_module, "BLOCK_BYTES", 64)
    path = tmp_path / f"v.{EXT[fmt]}"
    rows: list[dict[str, Any]] = [{"a": i, "b": i} for i in range(40)]
    rows[33]["a"] = "x"
    if fmt == "csv":
        path.write_text("a,b\n" + "".join(f"{r['a']},{r['b']}\n" for r in rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reader = FileSource(str(tmp_path), fmt).create_reader()
    with pytest.raises(SourceError) as e:
        list(reader.read(Split("v", str(path)), 0))
    assert e.value.row == 33


def test_nulls_and_types_become_plain_values(tmp_path: Path) -> None:
    ts = dt.datetime(2013, 1, 1, 5, 17, tzinfo=dt.UTC)
    table = pa.table(
        {
            "i": pa.array([1, None], pa.int64()),
            "f": pa.array([float("nan"), None], pa.float64()),
            "s": pa.array([None, "x"], pa.string()),
            "t": pa.array([ts, None], pa.timestamp("us", tz="UTC")),
            "d": pa.array([dt.date(2013, 1, 2), None], pa.date32()),
            "l": pa.array([[1, None], None], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "n.parquet")
    reader = FileSource(str(tmp_path)).create_reader()
    assert list(reader.read(Split("n", str(tmp_path / "n.parquet")), 0)) == [
        {
            "i": 1,
            "f": None,
            "s": None,
            "t": "2013-01-01T05:17:00+00:00",
            "d": "2013-01-02",
            "l": [1, None],
        },
        {"i": None, "f": None, "s": "x", "t": None, "d": None, "l": None},
    ]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_schema_fixes_types_of_columns_null_in_the_first_block(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(formats_module, "BLOCK_BYTES", 64)
    rows: list[dict[str, Any]] = [{"a": i, "b": None} for i in range(20)] + [{"a": 20, "b": 2.5}]
    path = tmp_path / f"n.{EXT[fmt]}"
    _write(str(path), fmt, rows)
    split = Split("n", str(path))
    with pytest.raises(SourceError) as e:
        list(FileSource(str(tmp_path), fmt).create_reader().read(split, 0))
    if fmt == "csv":
        assert e.value.row == 20
    typed = FileSource(str(tmp_path), fmt, schema=pa.schema([("b", pa.float64())]))
    assert list(pickle.loads(pickle.dumps(typed)).create_reader().read(split, 0)) == rows


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="'avro' is not one of"):
        FileSource("/x", "avro")


@pytest.mark.s3
def test_files_on_s3(s3: S3Target) -> None:
    base = f"{s3.base_url}/input"
    opts = s3.storage_options
    _write(f"{base}/b.parquet", "parquet", _rows(5, 5), **opts)
    _write(f"{base}/a.parquet", "parquet", _rows(5), **opts)
    src = FileSource(base, "parquet", storage_options=opts)
    listing = list_files(*fsspec.core.url_to_fs(base, **opts))
    assert [s.location for s in listing.splits] == [f"{base}/a.parquet", f"{base}/b.parquet"]
    assert not listing.complete
    driver = SourceDriver(src, 2)
    driver.poll()
    driver.step(0, 3)
    fsspec.open(f"{base}/_SUCCESS", "wb", **opts).open().close()
    driver.run_to_end()
    assert sorted(r["id"] for r in driver.output) == list(range(10))
    reader = src.create_reader()
    assert list(reader.read(listing.splits[1], 3)) == _rows(5, 5)[3:]
