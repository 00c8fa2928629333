"""moto's S3 server with an atomic conditional create, for fencing tests and benchmarks.

moto checks ``If-None-Match: *`` by reading, then writing, without a lock, and its
server is threaded: two racing creates of one key can both succeed, so "two drivers of
one job, the newer wins" passing on it proves nothing about the race it must lose.
Here every mutating request (PUT, POST, DELETE) runs under one lock, the check and the
write of a conditional create together, as a real store's are; reads stay concurrent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.server import ThreadedMotoServer

__all__ = ["AtomicMotoServer", "SerializedWrites"]

_MUTATING = frozenset({"PUT", "POST", "DELETE"})


class SerializedWrites:
    """A WSGI middleware running ``app``'s mutating requests one at a time (the whole
    response produced under the lock)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.serialized = 0  # requests run under the lock

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") not in _MUTATING:
            return self.app(environ, start_response)
        with self.lock:
            self.serialized += 1
            body = self.app(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()


class AtomicMotoServer(ThreadedMotoServer):
    """:class:`moto.server.ThreadedMotoServer` whose mutating requests are serialized
    (:class:`SerializedWrites`); same constructor, ``start``, ``stop`` and
    ``get_host_and_port``; ``writes``: the middleware, once serving."""

    writes: SerializedWrites | None = None

    def _server_entry(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        app = SerializedWrites(DomainDispatcherApplication(create_backend_app))
        self.writes = app
        self._server = make_server(self._ip_address, self._port, app, True)
        self._server_ready_event.set()
        self._server.serve_forever()
