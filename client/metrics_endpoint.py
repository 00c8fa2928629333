"""Serving a Prometheus registry over HTTP (nodes and the coordinator)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Metric, start_http_server
from prometheus_client.registry import RestrictedRegistry


class ConsistentRegistry(CollectorRegistry):
    """A registry whose collection (a scrape, :meth:`get_sample_value`) never sees half
    of an update: a recorder changes several metrics that belong together (a DFS request
    and the object it wrote) while holding :attr:`updating`, and every collection holds
    it too while it reads the values (the text is formatted after)."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        #: Held by a recorder for updates a scrape must see whole (reentrant).
        self.updating = threading.RLock()

    def collect(self) -> Iterable[Metric]:
        with self.updating:
            return list(super().collect())

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        return _ConsistentRestricted(names, self)


class _ConsistentRestricted(RestrictedRegistry):
    """A ``?name[]=`` scrape of a :class:`ConsistentRegistry`: under its lock too."""

    def __init__(self, names: Iterable[str], registry: ConsistentRegistry) -> None:
        super().__init__(names, registry)
        self._updating = registry.updating

    def collect(self) -> Iterable[Metric]:
        with self._updating:
            return list(super().collect())


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
