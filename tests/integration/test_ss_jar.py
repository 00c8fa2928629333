"""The JVM checkpoint file manager (jvm/): it builds from source with javac against
pyspark's jars, loads in a real Spark session, and routes paths: state files to the
bridge (here a scripted in-process bridge that records every request), everything else
and every state file when no bridge answers to Spark's default manager."""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError

from dstltree.structured_streaming import jar as jarmod
from dstltree.structured_streaming import wire
from tests.support.ss_session import ss_session

pytestmark = pytest.mark.spark

CLASSES = {
    "io/dstltree/spark/DstlCheckpointFileManager.class",
    "io/dstltree/spark/BridgeClient.class",
    "io/dstltree/spark/BridgeOutputStream.class",
}


class ScriptedBridge(socketserver.ThreadingUnixStreamServer):
    """A bridge of protocol version 1 in memory: ``files[(root, path)] = bytes``,
    ``ops``: every request's header in order; ``commit_error``: the code a ``commit``
    is refused with (None: accepted)."""

    daemon_threads = True

    def __init__(self, path: Path) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.ops: list[dict[str, Any]] = []
        self.commit_error: str | None = None
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        super().__init__(str(path), _Handler)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: ScriptedBridge = self.server  # type: ignore[assignment]
        with server.lock:
            server.conns.append(self.request)
        partial = bytearray()
        while True:
            try:
                header, payload = wire.read_frame(self.request.recv)
            except Exception:  # noqa: BLE001 - the client closed: this connection ends
                return
            with server.lock:
                server.ops.append(header)
                reply = self.answer(server, header, payload, partial)
            if reply is not None:
                self.request.sendall(wire.encode(*reply))

    def answer(
        self, server: ScriptedBridge, h: dict[str, Any], payload: bytes, partial: bytearray
    ) -> tuple[dict[str, Any], bytes] | None:
        op, key = h["op"], (h.get("root"), h.get("path"))
        if op == "hello":
            return {"ok": True, "version": 1}, b""
        if op == "put":
            partial += payload
            if not h["last"]:
                return None
            server.files[key] = bytes(partial)
            partial.clear()
            return {"ok": True, "length": len(server.files[key])}, b""
        if op == "stat":
            data = server.files.get(key)
            return {"ok": True, "exists": data is not None, "length": len(data or b"")}, b""
        if op == "read":
            chunk = server.files[key][h["offset"] : h["offset"] + h["length"]]
            return {"ok": True, "length": len(chunk)}, chunk
        if op == "list":
            prefix = h["dir"] + "/"
            names = [p[len(prefix) :] for (r, p) in server.files if r == h["root"]]
            files = [
                {"name": n, "length": len(server.files[(h["root"], prefix + n)])}
                for n in names
                if n and "/" not in n
            ]
            return {"ok": True, "files": files, "dirs": []}, b""
        if op == "delete":
            return {"ok": True, "deleted": server.files.pop(key, None) is not None}, b""
        if op == "drive":
            return {"ok": True, "boot": "b00t"}, b""
        if op == "commit" and server.commit_error:
            return {"ok": False, "error": "a file failed", "code": server.commit_error}, b""
        if op == "commit":
            return {"ok": True, "files": 0}, b""
        return {"ok": False, "error": f"unknown op {op}", "code": "malformed"}, b""


@pytest.fixture(scope="module")
def sock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sock")


@pytest.fixture(scope="module")
def spark(sock_dir: Path) -> Iterator[Any]:
    session = ss_session("local[2]", 2, topology=None, socket=sock_dir / "bridge.sock")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def bridge(sock_dir: Path) -> Iterator[ScriptedBridge]:
    server = ScriptedBridge(sock_dir / "bridge.sock")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        for conn in server.conns:  # the manager's pooled connections see their end
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        (sock_dir / "bridge.sock").unlink(missing_ok=True)
        thread.join(timeout=10)


def test_jar_builds_from_source(tmp_path: Path) -> None:
    out = tmp_path / "dstltree-spark.jar"
    jarmod.build_jar(out)
    with zipfile.ZipFile(out) as z:
        assert set(z.namelist()) >= CLASSES
    assert not jarmod.is_stale(out)


def test_jar_is_rebuilt_when_older_than_its_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jarmod, "BUILD_DIR", tmp_path / "j")
    jar = jarmod.checkout_jar(jarmod.running_line())
    with pytest.raises(jarmod.JarBuildError, match="make jar"):
        jarmod.jar_path(build=False)
    built = jarmod.jar_path()
    assert built == jar and built.exists() and not jarmod.is_stale(built)
    newest = max(s.stat().st_mtime for s in jarmod.java_sources())
    os.utime(built, (newest - 10, newest - 10))
    assert jarmod.is_stale(built)
    jarmod.jar_path()
    assert not jarmod.is_stale(built)


def test_no_javac_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jarmod.shutil, "which", lambda _name: None)
    with pytest.raises(jarmod.JarBuildError, match="javac"):
        jarmod.build_jar(tmp_path / "x.jar")


def _manager(spark: Any, path: str) -> Any:
    """Spark's own choice of manager for ``path`` under the session's configuration."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    cfm = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    return cfm.create(jvm.org.apache.hadoop.fs.Path(path), conf)


def _write(spark: Any, manager: Any, path: str, data: bytes) -> None:
    target = spark._jvm.org.apache.hadoop.fs.Path(path)
    manager.mkdirs(target.getParent())  # as Spark does before writing
    out = manager.createAtomic(target, True)
    out.write(bytearray(data))
    out.close()


def _read(spark: Any, manager: Any, path: str) -> bytes:
    stream = manager.open(spark._jvm.org.apache.hadoop.fs.Path(path))
    try:
        return bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def test_class_loads_in_a_spark_session(spark: Any, tmp_path: Path) -> None:
    m = _manager(spark, f"file:{tmp_path}/ckpt/offsets")
    assert m.getClass().getName() == jarmod.MANAGER_CLASS
    assert m.socket().endswith("bridge.sock")


def test_non_state_paths_go_to_the_default_manager(
    spark: Any, bridge: ScriptedBridge, tmp_path: Path
) -> None:
    root = f"file:{tmp_path}/ckpt"
    m = _manager(spark, f"{root}/offsets")
    _write(spark, m, f"{root}/offsets/0", b"v1\n{}")
    _write(spark, m, f"{root}/state/0/_metadata/metadata", b"meta")
    _write(spark, m, f"{root}/state/0/0/_metadata/schema", b"schema")  # Spark's, stays plain
    assert (tmp_path / "ckpt/offsets/0").read_bytes() == b"v1\n{}"
    assert (tmp_path / "ckpt/state/0/0/_metadata/schema").read_bytes() == b"schema"
    assert _read(spark, m, f"{root}/offsets/0") == b"v1\n{}"
    assert bridge.files == {}
    assert all(op["op"] != "put" for op in bridge.ops)


def test_state_files_go_to_the_bridge_and_read_back(
    spark: Any, bridge: ScriptedBridge, tmp_path: Path
) -> None:
    root = f"file:{tmp_path}/ckpt"
    m = _manager(spark, f"{root}/state/0/1")
    accepted = _jmx(spark, "BridgeStateFiles")
    big = bytes(range(256)) * (40 * 1024)  # 10 MiB: two chunks
    _write(spark, m, f"{root}/state/0/1/1.delta", b"one")
    _write(spark, m, f"{root}/state/0/1/2.delta", big)
    (tmp_path / "ckpt/state/0/1/0.delta").write_bytes(b"plain")  # written while it was down
    assert bridge.files[(root, "state/0/1/1.delta")] == b"one"
    assert bridge.files[(root, "state/0/1/2.delta")] == big
    assert _jmx(spark, "BridgeStateFiles") == accepted + 2
    assert not (tmp_path / "ckpt/state/0/1/1.delta").exists()
    puts = [op for op in bridge.ops if op["op"] == "put" and op["path"].endswith("2.delta")]
    assert [(p["offset"], p["last"]) for p in puts] == [(0, False), (8 << 20, True)]
    assert _read(spark, m, f"{root}/state/0/1/2.delta") == big
    assert _read(spark, m, f"{root}/state/0/1/0.delta") == b"plain"
    hpath = spark._jvm.org.apache.hadoop.fs.Path
    assert m.exists(hpath(f"{root}/state/0/1/1.delta"))
    assert not m.exists(hpath(f"{root}/state/0/1/9.delta"))
    listed = {s.getPath().getName(): s.getLen() for s in m.list(hpath(f"{root}/state/0/1"))}
    assert listed == {"0.delta": 5, "1.delta": 3, "2.delta": len(big)}
    m.delete(hpath(f"{root}/state/0/1/1.delta"))
    m.delete(hpath(f"{root}/state/0/1/0.delta"))
    assert set(bridge.files) == {(root, "state/0/1/2.delta")}
    assert not (tmp_path / "ckpt/state/0/1/0.delta").exists()


def test_commit_waits_for_the_bridge_and_fails_when_not_durable(
    spark: Any, bridge: ScriptedBridge, tmp_path: Path
) -> None:
    root = f"file:{tmp_path}/ckpt"
    m = _manager(spark, f"{root}/commits")
    commits, failed = _jmx(spark, "Commits"), _jmx(spark, "FailedCommits")
    _write(spark, m, f"{root}/commits/0", b"v1\n{}")
    assert {"op": "commit", "root": root, "timeout": 120} in bridge.ops
    assert _jmx(spark, "Commits") == commits + 1
    assert (tmp_path / "ckpt/commits/0").exists()
    bridge.commit_error = "unavailable"
    with pytest.raises(Py4JJavaError, match="not durable"):
        _write(spark, m, f"{root}/commits/1", b"v1\n{}")
    assert _jmx(spark, "FailedCommits") == failed + 1
    assert not (tmp_path / "ckpt/commits/1").exists()


def _jmx(spark: Any, attribute: str) -> int:
    """An attribute of the io.dstltree.spark:type=StateFiles MBean of the driver's JVM."""
    return int(spark._jvm.io.dstltree.spark.StateFileMetrics.attribute(attribute))


def test_no_bridge_writes_plain_files(spark: Any, tmp_path: Path) -> None:
    root = f"file:{tmp_path}/ckpt"
    cls = spark._jvm.io.dstltree.spark.DstlCheckpointFileManager
    before = cls.plainStateFiles()
    assert _jmx(spark, "PlainStateFiles") == before
    m = _manager(spark, f"{root}/state/0/2")
    _write(spark, m, f"{root}/state/0/2/1.changelog", b"changes")
    assert (tmp_path / "ckpt/state/0/2/1.changelog").read_bytes() == b"changes"
    assert cls.plainStateFiles() == before + 1 == _jmx(spark, "PlainStateFiles")
    assert _read(spark, m, f"{root}/state/0/2/1.changelog") == b"changes"
    _write(spark, m, f"{root}/commits/0", b"v1\n{}")  # nothing handed to a bridge: fine
    assert (tmp_path / "ckpt/commits/0").exists()


def test_the_driver_announces_itself_when_it_writes_offsets(
    spark: Any, bridge: ScriptedBridge, tmp_path: Path
) -> None:
    root = f"file:{tmp_path}/ckpt"
    m = _manager(spark, f"{root}/offsets")
    _write(spark, m, f"{root}/offsets/0", b"v1\n{}")
    assert {"op": "drive", "root": root} in bridge.ops
    assert (tmp_path / "ckpt/offsets/0").read_bytes() == b"v1\n{}"
    hello = next(op for op in bridge.ops if op["op"] == "hello")
    assert hello["app"] == spark.sparkContext.applicationId
    _write(spark, m, f"{root}/commits/0", b"v1\n{}")  # names the process drive reached
    assert {"op": "commit", "root": root, "timeout": 120, "boot": "b00t"} in bridge.ops
    bridge.shutdown()  # the bridge goes away before the next commit
    bridge.server_close()
    for conn in bridge.conns:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
    Path(bridge.server_address).unlink()
    with pytest.raises(Py4JJavaError, match="not durable"):  # it held the batch's files
        _write(spark, m, f"{root}/commits/1", b"v1\n{}")
    assert not (tmp_path / "ckpt/commits/1").exists()


def _copy_through(spark: Any, fs: Any, bridge: ScriptedBridge, tmp_path: Path, root: str) -> None:
    """copyFromLocalFile, getFileStatus, open, copyToLocalFile and delete of a state
    file go to the bridge; a path outside a state directory stays plain."""
    hpath = spark._jvm.org.apache.hadoop.fs.Path
    src = tmp_path / "local" / "000001-ab.sst"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(b"sst bytes")
    dst = f"{root}/state/0/1/SSTs/000001-ab.sst"
    fs.copyFromLocalFile(hpath(str(src)), hpath(dst))
    assert bridge.files[(root, "state/0/1/SSTs/000001-ab.sst")] == b"sst bytes"
    assert not (tmp_path / "ckpt/state/0/1/SSTs/000001-ab.sst").exists()
    assert fs.getFileStatus(hpath(dst)).getLen() == 9
    stream = fs.open(hpath(dst))
    assert bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)) == b"sst bytes"
    stream.close()
    back = tmp_path / "local" / "back" / "000001-ab.sst"
    fs.copyToLocalFile(hpath(dst), hpath(str(back)))
    assert back.read_bytes() == b"sst bytes"
    assert fs.delete(hpath(dst), False)
    assert (root, "state/0/1/SSTs/000001-ab.sst") not in bridge.files
    other = f"{root}/elsewhere/000001-ab.sst"
    fs.copyFromLocalFile(hpath(str(src)), hpath(other))
    assert (tmp_path / "ckpt/elsewhere/000001-ab.sst").read_bytes() == b"sst bytes"
    assert len(bridge.files) == 0


def test_the_local_file_system_takes_state_copies_to_the_bridge(
    spark: Any, bridge: ScriptedBridge, tmp_path: Path
) -> None:
    root = f"file:{tmp_path}/ckpt"
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    fs = spark._jvm.org.apache.hadoop.fs.Path(root).getFileSystem(conf)
    assert fs.getClass().getName() == "io.dstltree.spark.DstlLocalFileSystem"
    _copy_through(spark, fs, bridge, tmp_path, root)


def test_a_wrapped_file_system_takes_state_copies_to_the_bridge(
    spark: Any, bridge: ScriptedBridge, tmp_path: Path
) -> None:
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    conf.set("fs.wrapped.impl", "io.dstltree.spark.DstlFileSystem")
    conf.set("fs.wrapped.impl.disable.cache", "true")
    with pytest.raises(Py4JJavaError, match="dstltree.fs.wrapped.impl"):
        jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("wrapped:///"), conf)
    conf.set("dstltree.fs.wrapped.impl", "io.dstltree.spark.LatencyFileSystem")  # no delay
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("wrapped:///"), conf)
    assert fs.getClass().getName() == "io.dstltree.spark.DstlFileSystem"
    assert fs.getScheme() == "wrapped"
    _copy_through(spark, fs, bridge, tmp_path, f"wrapped:{tmp_path}/ckpt")
