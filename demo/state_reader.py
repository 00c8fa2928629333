"""A query's state rows, read back on every supported Spark line.

From Spark 4.0 the state data source (``spark.read.format("statestore")``) reads a
checkpoint's state. Spark 3.5 has none: :func:`state_rows` then opens each partition's
state store as Spark's own tasks do (``StateStoreProvider.createAndInit`` with the
schemas of ``state/<op>/_metadata/schema``, ``getReadStore(version)``) on the driver,
through py4j, so the files are read through the session's checkpoint file manager, the
tree's included. Rows come back as ``(key, value)`` tuples of Python values.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: The JVM package of the state store classes (the same from 3.5 to 4.x).
STATE_PACKAGE = "org.apache.spark.sql.execution.streaming.state"


def has_state_source(spark: Any) -> bool:
    """True when the running Spark has the state data source (4.0 and later)."""
    major = int(str(spark.version).split(".", 1)[0])
    return major >= 4


def state_rows(spark: Any, checkpoint: str, operator: int = 0) -> list[tuple[Any, Any]]:
    """Every ``(key, value)`` of ``operator``'s state at the latest committed batch of
    the query checkpointed at ``checkpoint``, keys and values as tuples (a struct as a
    tuple). Raises ValueError when the location has no committed batch, or what Spark
    raises."""
    if has_state_source(spark):
        reader = spark.read.format("statestore").option("operatorId", operator)
        rows = reader.load(checkpoint).select("key", "value").collect()
        return [(tuple(r["key"]), tuple(r["value"])) for r in rows]
    return _rows_by_provider(spark, checkpoint, operator)


def _rows_by_provider(spark: Any, checkpoint: str, operator: int) -> list[tuple[Any, Any]]:
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    root = jvm.org.apache.hadoop.fs.Path(checkpoint)
    manager = _manager_class(jvm).create(root, conf)
    version = _latest_commit(jvm, manager, checkpoint) + 1  # a batch's state version
    state_root = f"{checkpoint.rstrip('/')}/state"
    state = f"{state_root}/{operator}"
    partitions = sorted(
        int(s.getPath().getName())
        for s in manager.list(jvm.org.apache.hadoop.fs.Path(state))
        if re.fullmatch(r"\d+", s.getPath().getName())
    )
    pkg = _package(jvm, STATE_PACKAGE)
    store_conf = pkg.StateStoreConf.apply(spark._jsparkSession.sessionState().conf())
    run_id = jvm.java.util.UUID.randomUUID()
    out: list[tuple[Any, Any]] = []
    schemas: tuple[Any, Any] | None = None
    for p in partitions:
        # the store's root is the location's state/ (Spark: <location>/state/<op>/<part>)
        store_id = pkg.StateStoreId.apply(state_root, operator, p, "default")
        provider_id = pkg.StateStoreProviderId(store_id, run_id)
        if schemas is None:
            pair = pkg.StateSchemaCompatibilityChecker(provider_id, conf).readSchemaFile()
            schemas = (pair._1(), pair._2())
        key_schema, value_schema = schemas
        provider = pkg.StateStoreProvider.createAndInit(
            provider_id, key_schema, value_schema, 0, store_conf, conf
        )
        try:
            out.extend(_read_store(provider.getReadStore(version), key_schema, value_schema))
        finally:
            provider.close()
    return out


def _read_store(store: Any, key_schema: Any, value_schema: Any) -> list[tuple[Any, Any]]:
    key_types = _types(key_schema)
    value_types = _types(value_schema)
    it = store.iterator()
    rows = []
    try:
        while it.hasNext():
            pair = it.next()
            rows.append((_row(pair.key(), key_types), _row(pair.value(), value_types)))
    finally:
        store.abort()
    return rows


def _types(schema: Any) -> list[Any]:
    """The field types of a StructType, as its JSON form gives them."""
    return [f["type"] for f in json.loads(schema.json())["fields"]]


def _row(row: Any, types: list[Any]) -> tuple[Any, ...]:
    return tuple(_field(row, i, t) for i, t in enumerate(types))


def _field(row: Any, i: int, kind: Any) -> Any:
    if row.isNullAt(i):
        return None
    if isinstance(kind, dict):
        if kind.get("type") != "struct":
            raise ValueError(f"state field of type {kind.get('type')!r} is not read here")
        inner = [f["type"] for f in kind["fields"]]
        return _row(row.getStruct(i, len(inner)), inner)
    readers = {
        "string": lambda: row.getUTF8String(i).toString(),
        "long": lambda: row.getLong(i),
        "integer": lambda: row.getInt(i),
        "double": lambda: row.getDouble(i),
        "float": lambda: row.getFloat(i),
        "boolean": lambda: row.getBoolean(i),
        "timestamp": lambda: row.getLong(i),  # microseconds since the epoch
        "date": lambda: row.getInt(i),  # days since the epoch
    }
    if kind not in readers:
        raise ValueError(f"state field of type {kind!r} is not read here")
    return readers[kind]()


def _latest_commit(jvm: Any, manager: Any, checkpoint: str) -> int:
    commits = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/commits")
    ids = [
        int(s.getPath().getName())
        for s in manager.list(commits)
        if re.fullmatch(r"\d+", s.getPath().getName())
    ]
    if not ids:
        raise ValueError(f"{checkpoint}: no committed batch")
    return max(ids)


def _manager_class(jvm: Any) -> Any:
    """Spark's ``CheckpointFileManager`` (its package moved in 4.1)."""
    from py4j.java_gateway import JavaClass

    streaming = "org.apache.spark.sql.execution.streaming"
    for pkg in (f"{streaming}.checkpointing", streaming):
        cls = _package(jvm, pkg).CheckpointFileManager
        if isinstance(cls, JavaClass):
            return cls
    raise ValueError("no CheckpointFileManager class in this Spark")


def _package(jvm: Any, dotted: str) -> Any:
    obj = jvm
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
