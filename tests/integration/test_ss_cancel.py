"""Issue 45: a cancelled task is not a missing bridge, and a restarted query's rerun
batch is held for its commit. Real parts: a Spark session on ``local[4]`` with the
manager, the tree's nodes and bridge (``start_tree``).

- Cancel: an ``applyInPandasWithState`` query (HDFS-backed provider) whose function
  makes its Python worker exit (``os._exit``) once, while the other tasks of the stage
  wait for the bridge's reply to their state file's ``put``. With
  ``spark.task.maxFailures`` 1 the job fails and Spark cancels (interrupts) those tasks,
  as it did in pyspark's ``test_apply_in_pandas_with_state_python_worker_random_failure``.
  The waits are made deterministic by a proxy in front of the bridge that withholds the
  ``put`` frames ending a file until the cancel is over (a withheld frame whose client
  went away is dropped: the bridge writes nothing of it). No interrupted task may write
  its file as a plain file; the restarted query's result equals the batch answer.
- Rerun: a query's last commit is removed after a clean run (what Spark sees after its
  driver died between ``offsets/<N>`` and ``commits/<N>``) and the query restarted in a
  new application: its rerun batch's state files land in one object of the tree.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.client.reader import read_index
from dstltree.storage.store import ObjectStore
from dstltree.structured_streaming import configure
from dstltree.structured_streaming.configure import LocalServices
from dstltree.structured_streaming.view import query_key
from tests.support.ss_session import (
    PROVIDERS,
    STATE_SUFFIXES,
    ss_builder,
    ss_session,
    start_tree,
    write_json_input,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark

QUERY_TIMEOUT = 120.0  # seconds for one availableNow run
HOLD_TIMEOUT = 120.0  # seconds the proxy withholds a frame at most
WAITING_TASKS = 3  # of the 4 tasks of the stateful stage: all but the one that exits


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    s = start_tree(tmp_path_factory.mktemp("tree"))
    try:
        yield s
    finally:
        s.stop()


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``conn``, None at its end."""
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class HoldingProxy:
    """A Unix socket in front of the bridge on ``upstream``. While holding, each
    ``put`` frame with ``"last": true`` (the end of a state file) is withheld: its
    client waits for the reply. On :meth:`release` a withheld frame goes on to the
    bridge if its client is still connected, else it is dropped (counted in
    ``dropped``), so the bridge writes nothing of that file. ``held`` counts withheld
    frames and is also written to the file ``signal`` (read by the Python workers)."""

    def __init__(self, path: Path, upstream: Path, signal: Path) -> None:
        self.upstream = str(upstream)
        self.signal = signal
        self.cond = threading.Condition()
        self.holding = True
        self.held = 0
        self.dropped = 0
        self.sockets: list[socket.socket] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(64)
        signal.write_text("0")
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(self.upstream)
            with self.cond:
                self.sockets += [conn, up]
            threading.Thread(target=self._requests, args=(conn, up), daemon=True).start()
            threading.Thread(target=self._replies, args=(up, conn), daemon=True).start()

    def _requests(self, conn: socket.socket, up: socket.socket) -> None:
        try:
            while True:
                head = _recv_exact(conn, 4)
                if head is None:
                    return
                header = _recv_exact(conn, struct.unpack(">I", head)[0])
                size = _recv_exact(conn, 4)
                assert header is not None and size is not None
                payload = _recv_exact(conn, struct.unpack(">I", size)[0])
                assert payload is not None
                request = json.loads(header)
                end = request.get("op") == "put" and request.get("last")
                if end and self._hold() and self._client_gone(conn):
                    with self.cond:
                        self.dropped += 1
                    return
                up.sendall(head + header + size + payload)
        except OSError:
            return
        finally:
            _close(conn, up)

    def _hold(self) -> bool:
        """Withholds one frame until :meth:`release`; whether it was withheld."""
        with self.cond:
            if not self.holding:
                return False
            self.held += 1
            self.signal.write_text(str(self.held))
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: not self.holding, timeout=HOLD_TIMEOUT)
            return True

    @staticmethod
    def _client_gone(conn: socket.socket) -> bool:
        try:
            return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False  # connected, nothing sent
        except OSError:
            return True

    def _replies(self, up: socket.socket, conn: socket.socket) -> None:
        try:
            while chunk := up.recv(1 << 16):
                conn.sendall(chunk)
        except OSError:
            return
        finally:
            _close(conn, up)

    def release(self) -> None:
        """Stop holding: withheld frames go on (or are dropped), new ones pass."""
        with self.cond:
            self.holding = False
            self.cond.notify_all()

    def close(self) -> None:
        self.release()
        self.server.close()
        with self.cond:
            _close(*self.sockets)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


def _state_files(checkpoint: Path) -> list[Path]:
    return [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)]


def _plain_state_files(spark: Any) -> int:
    return int(spark._jvm.io.dstltree.spark.DstlCheckpointFileManager.plainStateFiles())


def _no_active_stage(spark: Any) -> bool:
    return len(spark.sparkContext.statusTracker().getActiveStageIds()) == 0


def _exits_once(marker: str, signal: str) -> Callable[[tuple[str], Iterator[Any], Any], Any]:
    """applyInPandasWithState's function: the running count and sum of ``v`` per key.
    For key ``k0``, once (until ``marker`` exists): wait until the proxy withholds the
    other tasks' state files (``signal``), then exit the Python worker."""

    def count_and_sum(key: tuple[str], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        import os

        import pandas as pd

        from tests.support.waiting import wait_until

        if key[0] == "k0" and not os.path.exists(marker):
            wait_until(lambda: int(Path(signal).read_text() or 0) >= WAITING_TASKS, 60, 0.05)
            Path(marker).touch()
            os._exit(1)
        n, total = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            n += len(pdf)
            total += int(pdf["v"].sum())
        state.update((n, total))
        yield pd.DataFrame({"k": [key[0]], "n": [n], "s": [total]})

    return count_and_sum


def _start_pandas_query(
    spark: Any, fn: Any, source: Path, checkpoint: Path, out: dict[int, list[tuple]]
) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    def sink(batch: Any, batch_id: int) -> None:
        out[batch_id] = [tuple(r) for r in batch.collect()]

    stream = spark.readStream.schema("k string, v long").json(str(source))
    return (
        stream.groupBy("k")
        .applyInPandasWithState(
            fn,
            "k string, n long, s long",
            "n long, s long",
            "Update",
            GroupStateTimeout.NoTimeout,
        )  # fmt: skip
        .writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _expected(spark: Any, source: Path) -> set[tuple]:
    from pyspark.sql import functions as F

    df = spark.read.schema("k string, v long").json(str(source))
    rows = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s")).collect()
    return {tuple(r) for r in rows}


def test_a_cancelled_task_writes_no_plain_state_file(
    services: LocalServices, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    write_json_input(source, 1, [{"k": f"k{i % 8}", "v": i} for i in range(40)])
    short = Path(tempfile.mkdtemp(prefix="dstl-", dir="/tmp"))  # a socket path <= 107
    proxy = HoldingProxy(short / "proxy.sock", services.socket, tmp_path / "held")
    builder = ss_builder(partitions=4).config("spark.task.maxFailures", "1")
    spark = configure(builder, socket=proxy.server.getsockname()).getOrCreate()
    try:
        spark.sparkContext.setLogLevel("ERROR")
        for k, v in PROVIDERS["hdfs"].items():
            spark.conf.set(k, v)
        plain = _plain_state_files(spark)
        fn = _exits_once(str(tmp_path / "exited"), str(tmp_path / "held"))
        out: dict[int, list[tuple]] = {}
        q = _start_pandas_query(spark, fn, source, checkpoint, out)
        try:  # the worker's exit fails the job: Spark cancels the waiting tasks
            with pytest.raises(StreamingQueryException):
                q.awaitTermination(QUERY_TIMEOUT)
        finally:
            q.stop()
        assert (tmp_path / "exited").exists()
        assert proxy.held == WAITING_TASKS and out == {}
        # every cancelled task has ended (and its thread with it) before the checks
        wait_until(lambda: _no_active_stage(spark), timeout=90, interval=0.1)
        assert _state_files(checkpoint) == []
        assert _plain_state_files(spark) == plain
        proxy.release()
        wait_until(lambda: proxy.dropped == WAITING_TASKS, timeout=30)  # interrupted

        q = _start_pandas_query(spark, fn, source, checkpoint, out)  # restarted
        try:
            assert q.awaitTermination(QUERY_TIMEOUT), "the query did not finish in time"
            assert q.exception() is None, q.exception()
        finally:
            q.stop()
        assert sorted(out) == [0]
        assert set(out[0]) == _expected(spark, source)
        assert (checkpoint / "commits" / "0").exists()
        assert _state_files(checkpoint) == []
        assert _plain_state_files(spark) == plain
    finally:
        spark.stop()
        proxy.close()
        shutil.rmtree(short, ignore_errors=True)


def _run_counts(spark: Any, source: Path, checkpoint: Path) -> set[tuple]:
    """``groupBy(k).count()`` over ``source`` (one file per batch) until every file is
    processed; the sink's rows."""
    for k, v in PROVIDERS["hdfs"].items():
        spark.conf.set(k, v)
    q = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy("k")
        .count()
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName("counts")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "the query did not finish in time"
        assert q.exception() is None, q.exception()
        return {tuple(r) for r in spark.sql("SELECT k, count FROM counts").collect()}
    finally:
        q.stop()


def _objects(base: Path) -> set[Path]:
    """The objects written under ``base`` (not the empty reservations of object names
    a node keeps: one of those becomes an object later)."""
    return {p for p in base.rglob("*.dstl") if p.stat().st_size > 0}


def _objects_with(base: Path, names: set[str], skip: set[Path]) -> dict[Path, set[str]]:
    """The objects under ``base`` (but ``skip``) holding segments of log ids in
    ``names``: object -> those log ids."""
    store = ObjectStore(str(base))
    found: dict[Path, set[str]] = {}
    for obj in sorted(_objects(base) - skip):
        ids = {ref.log_id for ref in read_index(store, str(obj))} & names
        if ids:
            found[obj] = ids
    return found


def test_a_restarted_querys_rerun_batch_lands_in_one_object(
    services: LocalServices, tmp_path: Path
) -> None:
    partitions = 20
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in (1, 2, 3):
        write_json_input(source, n, [{"k": f"k{i % 10}", "v": i * n} for i in range(30)])
    base = Path(services.nodes.local_tree.topology.base_path)
    spark = ss_session(partitions=partitions, socket=services.socket)
    try:
        first = _run_counts(spark, source, checkpoint)
    finally:
        spark.stop()
    assert first == {(f"k{i}", 9) for i in range(10)}
    # the driver "died" after offsets/2, before commits/2: batch 2 runs again
    assert (checkpoint / "offsets" / "2").exists()
    for name in ("2", ".2.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    before = _objects(base)

    spark = ss_session(partitions=partitions, socket=services.socket)  # a new application
    try:
        assert _run_counts(spark, source, checkpoint) == first
    finally:
        spark.stop()
    assert (checkpoint / "commits" / "2").exists()
    assert not (checkpoint / "commits" / "3").exists()
    assert _state_files(checkpoint) == []
    key = query_key(f"file:{checkpoint}")
    rerun = {f"ss/{key}/state/0/{p}/3.delta" for p in range(partitions)}  # batch 2: v3
    objects = _objects_with(base, rerun, before)
    assert list(objects.values()) == [rerun], {str(o): len(ids) for o, ids in objects.items()}
