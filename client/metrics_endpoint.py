"""Serving a Prometheus registry over HTTP (nodes and the coordinator)."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server


class MetricsEndpoint:
    """Serves ``registry`` at ``http://host:port/metrics``: ``port`` 0 picks a free port,
    None serves nothing. ``close()`` stops serving (idempotent)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int | None) -> None:
        self.host = host
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        if port is not None:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
            self.port = int(self._server.server_port)

    @property
    def url(self) -> str | None:
        """``http://host:port/metrics``, or None when not served."""
        if self.port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
