"""The bridge server: a Unix domain socket on the host, a thread per connection, one
:class:`~dstltree.client.api.ChangelogClient` to the host's aggregator node
(docs/structured-streaming.md, "Bridge protocol, version 1").

From Python::

    bridge = Bridge.open(socket_path, base_path, node=["tcp://..."])
    bridge.start()            # listening when it returns
    ...
    bridge.stop()

or as a process: ``dstl bridge --topology T --socket PATH`` (``python -m
dstltree.structured_streaming.bridge`` takes the same options), which prints
``bridge ready on <socket>`` once listening and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstltree.client.api import ChangelogClient
from dstltree.structured_streaming import paths, registry, wire
from dstltree.structured_streaming.files import TreeFiles
from dstltree.structured_streaming.wire import ConnectionClosed, WireError

if TYPE_CHECKING:
    from dstltree.security.curve import Curve

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_PENDING_BYTES = 256 * 1024 * 1024
MANIFEST_INTERVAL = 2.0  # s between manifest writes of a changed root, at least
PUT_WAIT = 45.0  # s a put not held for a commit waits to be durable (below the JVM's 60 s)


def default_socket_path() -> Path:
    """``/tmp/dstltree-<uid>/bridge.sock``: the protocol's default."""
    return Path(f"/tmp/dstltree-{os.getuid()}/bridge.sock")


def default_bridge_id(socket_path: Path) -> str:
    """``<host name>-<8 hex digits of sha256(socket path)>``, at most 64 characters of
    ``[A-Za-z0-9._-]``: stable across restarts of the same bridge, distinct between
    hosts and between bridges of one host."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:55] or "host"
    digest = hashlib.sha256(str(socket_path).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{host}-{digest[:8]}"


class BridgeInUse(RuntimeError):
    """The socket path is taken by a live bridge, or by something not a socket."""


def _prepare_path(path: Path) -> None:
    """Make the socket's directory (0700, ours) and clear a stale socket. Raises
    BridgeInUse when a live bridge answers there or the path is not a socket, or the
    directory belongs to another user."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.parent.stat()
    if st.st_uid != os.getuid():
        raise BridgeInUse(f"{path.parent} belongs to uid {st.st_uid}, not {os.getuid()}")
    os.chmod(path.parent, 0o700)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise BridgeInUse(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2.0)
        probe.connect(str(path))
    except OSError as e:
        if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
        path.unlink(missing_ok=True)  # stale: its bridge is gone
        return
    finally:
        probe.close()
    raise BridgeInUse(f"a bridge is already listening on {path}")


class Bridge:
    """Serves the bridge protocol on ``socket_path`` for the files in ``files``.
    ``max_connections``: connections served at once (more are refused with code
    ``unavailable``). ``manifest_interval``: seconds between manifest writes."""

    def __init__(
        self,
        socket_path: Path,
        files: TreeFiles,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        manifest_interval: float = MANIFEST_INTERVAL,
        owns_client: bool = True,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.files = files
        self.max_connections = max_connections
        self.manifest_interval = manifest_interval
        self._owns_client = owns_client
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def open(
        cls,
        socket_path: Path | str,
        base_path: str,
        node: str | Sequence[str] | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        security: Curve | None = None,
        ack_timeout: float = 10.0,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        bridge_id: str | None = None,
        link: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Bridge:
        """A bridge with its own client on ``base_path`` (fsspec URL): through the
        aggregator ``node`` (endpoints in order of preference; a segment not acked
        within ``ack_timeout`` s is written straight to the DFS), or, with
        ``node=None``, straight to the DFS. ``bridge_id``: its name among the bridges
        of other hosts (None: :func:`default_bridge_id`). ``link``: how the client
        talks to its nodes (``TopologyConfig.link_settings``; None: the defaults).
        Further keywords go to :class:`Bridge`."""
        client = ChangelogClient.open(
            base_path,
            node=list(node) if isinstance(node, list | tuple) else node,
            storage_options=storage_options,
            security=security,
            ack_timeout=ack_timeout,
            **(link or {}),
        )
        files = TreeFiles(
            client,
            max_pending_bytes=max_pending_bytes,
            bridge_id=default_bridge_id(Path(socket_path)) if bridge_id is None else bridge_id,
        )
        return cls(Path(socket_path), files, **kw)

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Bind and listen (socket 0600 in a 0700 directory); serve in threads. Raises
        BridgeInUse (see :func:`_prepare_path`), OSError."""
        _prepare_path(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        sock.listen(64)
        self._listener = sock
        for target, name in ((self._accept_loop, "accept"), (self._housekeeper, "housekeep")):
            t = threading.Thread(target=target, name=f"bridge-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop listening, close connections, close the client (waits for uploads in
        flight), write the last manifests, delete the orphans of its queries (copies of
        writes sent twice, whatever their age: none is on its way) and remove the
        socket. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(timeout)
        self.files.close_notes()
        self.files.flush()  # held writes: persisted before the client closes
        if self._owns_client:
            self.files.client.close()
        try:
            self.files.housekeep(final=True)
        except Exception:  # noqa: BLE001 - the next start rebuilds from the indexes
            log.exception("last housekeeping failed")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> Bridge:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _housekeeper(self) -> None:
        while not self._stopping.wait(self.manifest_interval):
            try:
                self.files.housekeep()
            except Exception:  # noqa: BLE001 - housekeeping never stops the bridge
                log.exception("housekeeping failed")

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # the listener was shut down
            with self._lock:
                full = len(self._conns) >= self.max_connections
                if not full:
                    self._conns.add(conn)
            if full:
                _refuse(conn)
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, conn: socket.socket) -> None:
        try:
            Connection(conn, self.files).run()
        except Exception:  # noqa: BLE001 - one connection never stops the others
            log.exception("bridge connection failed")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()


def _refuse(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(wire.encode(wire.error_header("unavailable", "too many connections")))
    conn.close()


class Connection:
    """One client connection: ``hello`` first, then requests in order. Puts are
    buffered per (root, path) until ``last``; a connection that ends first writes
    nothing of them."""

    def __init__(self, sock: socket.socket, files: TreeFiles) -> None:
        self.sock = sock
        self.files = files
        self.version: int | None = None
        self.app = ""  # the Spark application, from hello
        self._puts: dict[tuple[str, str], list[bytes]] = {}
        self._held = 0  # bytes reserved by unfinished puts

    def run(self) -> None:
        """Serve until the peer closes or a fatal error."""
        try:
            while self._one():
                pass
        finally:
            self.files.unreserve(self._held)

    def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.sock.sendall(wire.encode(header, payload))

    def _one(self) -> bool:
        """Serve one frame; False to close the connection."""
        try:
            header, payload = wire.read_frame(self.sock.recv)
        except ConnectionClosed:
            return False
        except OSError:
            return False
        except WireError as e:
            self._reply_error(e)
            return not e.fatal
        try:
            reply = self._handle(header, payload)
        except WireError as e:
            self._reply_error(e)
            fatal = e.fatal or (header.get("op") == "put" and header.get("last") is not True)
            return not fatal
        except Exception as e:  # noqa: BLE001 - reported to the peer, then closed
            log.exception("request failed")
            self._reply_error(WireError("internal", f"{type(e).__name__}: {e}"))
            return False
        if reply is not None:
            self._send(*reply)
        return True

    def _reply_error(self, e: WireError) -> None:
        extra = {"versions": list(wire.PROTOCOL_VERSIONS)} if e.code == "version" else {}
        with contextlib.suppress(OSError):
            self._send(wire.error_header(e.code, str(e), **extra))

    def _handle(
        self, header: dict[str, Any], payload: bytes
    ) -> tuple[dict[str, Any], bytes] | None:
        req = wire.parse_request(header, payload)
        if isinstance(req, wire.Hello):
            self.version = wire.negotiate(req.versions)
            self.app = req.app
            if req.jvm:
                with self.files.cond:
                    self.files.ledger.on_plain_report(req.app, req.jvm, req.plain)
            return {"ok": True, "version": self.version}, b""
        if self.version is None:
            raise WireError("version", "the first request must be hello")
        if self.version < 2:
            wire.check_v1(req)
        f = self.files
        match req:
            case wire.Put():
                return self._put(req)
            case wire.Stat():
                length = f.stat(req.root, req.path)
                return {"ok": True, "exists": length is not None, "length": length or 0}, b""
            case wire.Read():
                data = f.read(req.root, req.path, req.offset, min(req.length, wire.MAX_PAYLOAD))
                return {"ok": True, "length": len(data)}, data
            case wire.List():
                files, dirs = f.listing(req.root, req.dir)
                listed = [{"name": n, "length": n_} for n, n_ in files]
                return {"ok": True, "files": listed, "dirs": dirs}, b""
            case wire.Delete():
                return {"ok": True, "deleted": f.delete(req.root, req.path, self.app)}, b""
            case wire.Commit():
                return self._commit(req)
            case wire.Status():
                return {"ok": True, **f.status(), "pid": os.getpid()}, b""
            case wire.Drive():
                f.drive(req.root, self.app)
                return {"ok": True, "boot": f.boot}, b""
        raise WireError("malformed", f"unhandled request {req!r}")

    def _put(self, req: wire.Put) -> tuple[dict[str, Any], bytes] | None:
        key = (req.root, req.path)
        chunks = self._puts.setdefault(key, [])
        sent = sum(len(c) for c in chunks)
        if req.offset != sent:
            self._drop(key)
            raise WireError("malformed", f"put at offset {req.offset}, {sent} bytes sent before")
        self.files.reserve(len(req.data))
        self._held += len(req.data)
        chunks.append(req.data)
        if not req.last:
            return None
        data = b"".join(self._puts.pop(key))
        self._held -= len(data)
        if paths.kind(req.path) == paths.OFFSETS:  # with the batch's log entries
            self.files.put_synced(req.root, req.path, data, self.app, PUT_WAIT)
            return {"ok": True, "length": len(data)}, b""
        try:
            sqn, held = self.files.put(req.root, req.path, data, self.app)
        except BaseException:
            self.files.unreserve(len(data))
            raise
        if not held:  # no commit of this application here: durable before the reply
            self.files.wait_written(req.root, req.path, sqn, PUT_WAIT)
        return {"ok": True, "length": len(data)}, b""

    def _commit(self, req: wire.Commit) -> tuple[dict[str, Any], bytes]:
        """A commit, with its commit file when the request carries one (protocol 2)."""
        file = None
        if req.path is not None:
            if paths.kind(req.path) != paths.COMMIT:
                raise WireError("path", f"a commit carries commits/<N>, not {req.path!r}")
            file = (req.path, req.data)
        waited = self.files.commit(req.root, self.app, req.timeout, req.boot, file)
        return {"ok": True, "files": waited}, b""

    def _drop(self, key: tuple[str, str]) -> None:
        n = sum(len(c) for c in self._puts.pop(key, []))
        self._held -= n
        self.files.unreserve(n)


# -- the process -------------------------------------------------------------------------


def bridge_from_topology(
    topology: Path,
    socket_path: Path,
    node: Sequence[str] = (),
    base_path: str = "",
    ack_timeout: float = 10.0,
) -> Bridge:
    """A bridge configured by a topology file: its base path, storage options and
    CURVE keys (``$DSTL_KEYS`` or ``security.keys``); ``node``: the host's node
    endpoints (none: writes go straight to the DFS). Raises TopologyError."""
    from dstltree.security.curve import Curve
    from dstltree.security.settings import SecuritySettings, cluster_keys_for_nodes
    from dstltree.topology.config import load_topology

    topo = load_topology(topology)
    keys = None
    if node:
        keys = cluster_keys_for_nodes(topo.security or SecuritySettings(), str(topology), False)
    return Bridge.open(
        socket_path,
        base_path or topo.base_path,
        list(node) or None,
        storage_options=topo.storage_options,
        security=None if keys is None else Curve.for_writer(keys),
        ack_timeout=ack_timeout,
        link=topo.link_settings(),
    )


def serve(bridge: Bridge, metrics_port: int | None = None, metrics_host: str = "127.0.0.1") -> None:
    """Start ``bridge``, print ``bridge ready on <socket>`` (and ``bridge metrics on
    <url>`` when ``metrics_port`` is set: 0 picks a free port), serve until SIGTERM or
    SIGINT, then stop it. While it serves, the bridge is listed for ``dstl status`` (the
    registry module). Call from the main thread."""
    from dstltree.client.metrics_endpoint import MetricsEndpoint
    from dstltree.structured_streaming.metrics import bridge_registry

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    bridge.start()
    endpoint = MetricsEndpoint(bridge_registry(bridge.files), metrics_host, metrics_port)
    bridge_id = bridge.files.bridge_id
    try:
        registry.register(bridge_id, bridge.socket_path, endpoint.url)
    except OSError as e:  # dstl status then needs --bridge SOCKET
        log.warning("cannot register the bridge for dstl status: %s", e)
    print(f"bridge ready on {bridge.socket_path}", flush=True)
    if endpoint.url is not None:
        print(f"bridge metrics on {endpoint.url}", flush=True)
    try:
        done.wait()
    finally:
        registry.unregister(bridge_id, bridge.socket_path)
        endpoint.close()
        bridge.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dstltree.structured_streaming.bridge``: the options of ``dstl bridge``."""
    p = argparse.ArgumentParser(prog="python -m dstltree.structured_streaming.bridge")
    p.add_argument("--topology", type=Path, required=True)
    p.add_argument("--socket", type=Path, default=default_socket_path())
    p.add_argument("--node", action="append", default=[])
    p.add_argument("--base-path", default="")
    p.add_argument("--ack-timeout", type=float, default=10.0)
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--metrics-host", default="127.0.0.1")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    try:
        bridge = bridge_from_topology(a.topology, a.socket, a.node, a.base_path, a.ack_timeout)
        serve(bridge, a.metrics_port, a.metrics_host)
    except BridgeInUse as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
