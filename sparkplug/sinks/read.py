"""Reading a file sink's committed output in commit order (tests, small results)."""

from __future__ import annotations

import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from dstltree.sparkplug.sinks.layout import is_final_name
from dstltree.storage.store import ObjectStore, translate

_READERS = {"parquet": pq.read_table, "csv": pa_csv.read_csv, "json": pa_json.read_json}


def committed_files(url: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """URLs of the committed part files directly under ``url``, in commit order."""
    store = ObjectStore(url, storage_options)
    files = store.list_files(store.base_url)
    return [
        f
        for f in files
        if posixpath.dirname(f) == store.base_url.rstrip("/")
        and is_final_name(posixpath.basename(f))
    ]


def read_committed(
    url: str, format: str = "parquet", storage_options: dict[str, Any] | None = None
) -> pa.Table:
    """Every committed row under ``url`` as one table, files in commit order (staged
    and in-progress files are never read). Raises StorageError."""
    store = ObjectStore(url, storage_options)
    tables = []
    for f in committed_files(url, storage_options):
        try:
            with store.fs.open(f, "rb") as fh:
                tables.append(_READERS[format](fh))
        except Exception as e:
            raise translate("read", f, e) from e
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
