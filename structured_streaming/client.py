"""A reader of a query root's view on this host's bridge, over the bridge protocol
(docs/structured-streaming.md, "Bridge protocol", version 2).

What a ``dstl://<query>/`` location holds exists in the tree alone: there is no folder
to look at. Tools that inspect such a location (the demo's checks, ``dstl`` commands)
ask the bridge, as Spark's JVM does: ``list`` a directory, ``stat`` and ``read`` a file.
The client sends nothing that changes the view.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dstltree.structured_streaming import wire

__all__ = ["BridgeReader", "BridgeRequestError"]

READ_CHUNK = 4 << 20  # bytes asked for per read request (the bridge caps at MAX_PAYLOAD)


class BridgeRequestError(RuntimeError):
    """The bridge refused a request; ``code`` is its reply code (wire.CODES)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class BridgeReader:
    """One connection to the bridge listening on the Unix socket ``path``; ``timeout``
    (seconds) bounds every request. Raises OSError when it cannot connect and
    BridgeRequestError when the bridge speaks no version 2 (a bridge that predates
    ``dstl://`` locations)."""

    def __init__(self, path: Path | str, timeout: float = 30.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(str(path))
            self._call({"op": "hello", "versions": [2]})
        except BaseException:
            self._sock.close()
            raise

    def _call(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        for buf in wire.dump(header):
            self._sock.sendall(buf)
        reply, payload = wire.read_frame(self._sock.recv)
        if not reply.get("ok"):
            raise BridgeRequestError(str(reply.get("code")), str(reply.get("error")))
        return reply, payload

    def listing(self, root: str, directory: str = "") -> tuple[dict[str, int], list[str]]:
        """The direct children of ``directory`` ("" the root) of query root ``root``
        (e.g. ``dstl://q``): ({file name: length in bytes}, [directory names])."""
        reply, _ = self._call({"op": "list", "root": root, "dir": directory})
        files = {str(f["name"]): int(f["length"]) for f in reply.get("files", [])}
        return files, [str(d) for d in reply.get("dirs", [])]

    def walk(self, root: str, directory: str = "") -> Iterator[tuple[str, int]]:
        """(path relative to the root, length in bytes) of every file below
        ``directory``, depth first."""
        files, dirs = self.listing(root, directory)
        prefix = directory + "/" if directory else ""
        for name, length in sorted(files.items()):
            yield prefix + name, length
        for d in sorted(dirs):
            yield from self.walk(root, prefix + d)

    def read(self, root: str, path: str) -> bytes:
        """The whole file ``path`` of ``root``. Raises BridgeRequestError (code
        ``not-found`` for a file the view does not hold)."""
        out = bytearray()
        while True:
            header = {"op": "read", "root": root, "path": path}
            _, data = self._call({**header, "offset": len(out), "length": READ_CHUNK})
            if not data:
                return bytes(out)
            out += data

    def status(self) -> dict[str, Any]:
        """The bridge's figures (docs/structured-streaming.md, "Bridge status"):
        ``bridge``, ``pid``, ``counts``, ``bytes`` and one object per query root in
        ``queries``."""
        reply, _ = self._call({"op": "status"})
        reply.pop("ok", None)
        return reply

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> BridgeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
