"""A small Python client of the structured-streaming bridge protocol (for tests)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from dstltree.structured_streaming import wire


class BridgeClient:
    """One connection to a bridge; ``hello`` (for Spark application ``app``, protocol
    ``versions``) is sent on open."""

    def __init__(
        self,
        path: Path | str,
        timeout: float = 30.0,
        hello: bool = True,
        app: str = "",
        versions: tuple[int, ...] = (1,),
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        if hello:
            h = {"op": "hello", "versions": list(versions), "app": app}
            assert self.call(h)[0]["version"] == max(versions)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> tuple[dict[str, Any], bytes]:
        return wire.read_frame(self.sock.recv)

    def call(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        self.sock.sendall(wire.encode(header, payload))
        return self.recv()

    def ok(self, header: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
        h, _ = self.call(header, payload)
        assert h["ok"], h
        return h

    def put(self, root: str, path: str, data: bytes, chunk: int = 1 << 20) -> dict[str, Any]:
        offsets = list(range(0, len(data), chunk)) or [0]
        for off in offsets[:-1]:
            piece = data[off : off + chunk]
            self.sock.sendall(
                wire.encode(
                    {"op": "put", "root": root, "path": path, "offset": off, "last": False},
                    piece,
                )
            )
        last = offsets[-1]
        return self.ok(
            {"op": "put", "root": root, "path": path, "offset": last, "last": True},
            data[last:],
        )

    def read_all(self, root: str, path: str) -> bytes:
        out = b""
        while True:
            h, data = self.call(
                {"op": "read", "root": root, "path": path, "offset": len(out), "length": 3 << 20}
            )
            assert h["ok"], h
            if not data:
                return out
            out += data

    def stat(self, root: str, path: str) -> dict[str, Any]:
        return self.ok({"op": "stat", "root": root, "path": path})

    def list(self, root: str, d: str) -> dict[str, Any]:
        return self.ok({"op": "list", "root": root, "dir": d})

    def delete(self, root: str, path: str) -> bool:
        return bool(self.ok({"op": "delete", "root": root, "path": path})["deleted"])

    def commit(self, root: str, timeout: float = 30.0) -> dict[str, Any]:
        h, _ = self.call({"op": "commit", "root": root, "timeout": timeout})
        return h

    def drive(self, root: str) -> dict[str, Any]:
        """What the driver sends as it writes ``offsets/<N>``: a batch of ``root`` runs."""
        h, _ = self.call({"op": "drive", "root": root})
        return h

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BridgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
