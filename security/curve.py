"""Configuring ZeroMQ sockets for CURVE, and the process-wide ZAP authenticator.

Server sockets get ``curve_server``, their secret key and a ZAP domain
(``dstl-<role>-<digest of the accepted keys>``); the accepted client public keys are
registered for that domain with ONE ``zmq.auth.thread.ThreadAuthenticator`` on
``zmq.Context.instance()`` (started on first use, stopped at exit), whose key provider
refuses every other key and counts the refusals (:func:`auth_refusals`) and the
accepted handshakes by key (:func:`auth_accepts`). A client without CURVE, or with
another server key, fails the handshake before any message.

During a key rotation a client knows several server keys (:attr:`Curve.server_keys`);
:func:`configure_client` sets the first and remembers them all for the socket
(:func:`server_keys_of`), which :class:`dstltree.client.links.MonitoredDealer` tries
in turn.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import zmq
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from zmq.auth.thread import ThreadAuthenticator

from dstltree.security.keys import ClusterKeys, Keypair, fingerprint

log = logging.getLogger("dstltree.security")


@dataclass(frozen=True, repr=False)
class Curve:
    """The CURVE settings of one party: its own ``keypair``, the public key of the
    servers it connects to (``server_key``; during a key rotation
    ``other_server_keys`` too, tried after it), and the client public keys it accepts
    when it serves (``clients``). A party that only connects needs no ``clients``; one
    that only serves needs no ``server_key``."""

    keypair: Keypair
    server_key: bytes | None = None
    clients: frozenset[bytes] = frozenset()
    other_server_keys: tuple[bytes, ...] = ()

    @property
    def server_keys(self) -> tuple[bytes, ...]:
        """The server public keys a client tries, in order (none without
        ``server_key``; duplicates dropped)."""
        if self.server_key is None:
            return ()
        return tuple(dict.fromkeys((self.server_key, *self.other_server_keys)))

    @classmethod
    def shared(cls, keypair: Keypair) -> Curve:
        """Every party holds ``keypair`` (the per-job key): each serves with it,
        connects to the others with it and accepts only it."""
        return cls(keypair, keypair.public, frozenset({keypair.public}))

    @classmethod
    def for_node(cls, keys: ClusterKeys) -> Curve:
        """An aggregator node: serves with the node keypair, accepts nodes and writers,
        connects to other nodes with the node keypair; during a key rotation it accepts
        both generations' keys and knows both node keys (:class:`ClusterKeys`)."""
        first, *others = keys.node_keys()
        return cls(keys.node, first, keys.accepted(), tuple(others))

    @classmethod
    def for_writer(cls, keys: ClusterKeys) -> Curve:
        """A client of the nodes: the writer keypair, the nodes' public key (both
        generations' during a rotation, the one in use first)."""
        first, *others = keys.node_keys()
        return cls(keys.writer, first, other_server_keys=tuple(others))

    def domain(self, role: str) -> str:
        """The ZAP domain of a server of ``role`` accepting :attr:`clients`."""
        digest = hashlib.sha256(b"\n".join(sorted(self.clients))).hexdigest()[:12]
        return f"dstl-{role}-{digest}"

    def __repr__(self) -> str:
        return (
            f"Curve(public={self.keypair.public.decode()!r}, clients={len(self.clients)}, "
            f"server_keys={len(self.server_keys)})"
        )


def configure_server(sock: zmq.Socket, curve: Curve | None, role: str) -> None:
    """Make ``sock`` (of ``zmq.Context.instance()``, before bind) a CURVE server that
    accepts only ``curve.clients`` (ZAP domain per ``role``, e.g. "node"); None: left
    plaintext. Raises ValueError without a secret key or accepted clients, or for a
    socket of another context (its ZAP handler would be missing)."""
    if curve is None:
        return
    if curve.keypair.secret is None or not curve.clients:
        raise ValueError(f"{role}: a CURVE server needs its secret key and accepted clients")
    if sock.context.underlying != zmq.Context.instance().underlying:
        raise ValueError(f"{role}: CURVE servers must use zmq.Context.instance()")
    domain = curve.domain(role)
    _register(domain, role, curve.clients)
    if role == "node":  # what this node serves with and accepts (dstl_auth_server_keys)
        with _lock:
            _serving[fingerprint(curve.keypair.public)] = ",".join(
                sorted(fingerprint(k) for k in curve.clients)
            )
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler: refuse, never allow
    sock.zap_domain = domain.encode()
    sock.curve_secretkey = curve.keypair.secret
    sock.curve_publickey = curve.keypair.public
    sock.curve_server = True


def configure_client(sock: zmq.Socket, curve: Curve | None) -> None:
    """Make ``sock`` (before connect) a CURVE client with ``curve.keypair`` trusting
    ``curve.server_key``, and remember all of ``curve.server_keys`` for it
    (:func:`server_keys_of`); None: left plaintext. Raises ValueError without a secret
    key or server key."""
    if curve is None:
        return
    if curve.keypair.secret is None or curve.server_key is None:
        raise ValueError("a CURVE client needs its secret key and the server's public key")
    sock.curve_secretkey = curve.keypair.secret
    sock.curve_publickey = curve.keypair.public
    sock.curve_serverkey = curve.server_key
    with _lock:
        _server_keys[sock] = curve.server_keys


def server_keys_of(sock: zmq.Socket) -> tuple[bytes, ...]:
    """The server public keys :func:`configure_client` gave ``sock``, in the order to
    try them; () for a socket it did not configure (plaintext)."""
    with _lock:
        return _server_keys.get(sock, ())


class _KeyProvider:
    """Accepts the registered public keys of one domain; counts every other key."""

    def __init__(self, role: str, keys: frozenset[bytes]) -> None:
        self.role = role
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            if self.role == "node":  # cluster keys only: job keys change at every run
                with _lock:
                    _accepts[(self.role, key)] += 1
            return True
        with _lock:
            _refusals[self.role] += 1
        log.warning("%s: refused a CURVE client with an unknown key %s", self.role, key[:8])
        return False


_lock = threading.Lock()
_refusals: Counter[str] = Counter()
_accepts: Counter[tuple[str, bytes]] = Counter()
_serving: dict[str, str] = {}  # a node's server key fingerprint -> accepted fingerprints
_server_keys: weakref.WeakKeyDictionary[zmq.Socket, tuple[bytes, ...]] = weakref.WeakKeyDictionary()
_auth: ThreadAuthenticator | None = None
_auth_pid = 0
_domains: set[str] = set()


def _register(domain: str, role: str, keys: frozenset[bytes]) -> None:
    global _auth, _auth_pid
    with _lock:
        if _auth is None or _auth_pid != os.getpid():  # a forked child starts its own
            _auth = ThreadAuthenticator(zmq.Context.instance(), log=log)
            _auth.start()
            _auth_pid = os.getpid()
            _domains.clear()
            if not _atexit_registered.is_set():
                _atexit_registered.set()
                atexit.register(stop_authenticator)
        if domain not in _domains:  # same domain = same keys (the digest): set once
            _auth.configure_curve_callback(domain, _KeyProvider(role, keys))
            _domains.add(domain)


_atexit_registered = threading.Event()


def auth_refusals() -> dict[str, int]:
    """CURVE clients refused by this process's authenticator (unknown public key), by
    server role ("node", "coordinator", "exchange")."""
    with _lock:
        return dict(_refusals)


def auth_accepts() -> dict[tuple[str, str], int]:
    """CURVE handshakes this process's authenticator accepted as a node (role "node";
    the per-job keys of other roles are not counted), by role and the client key's
    fingerprint (:func:`~dstltree.security.keys.fingerprint`, as ``dstl
    keys status`` shows it): during a key rotation, whether clients still use a
    generation's key."""
    with _lock:
        counts = list(_accepts.items())
    return {(role, fingerprint(key)): n for (role, key), n in counts}


class RefusalCollector:
    """A Prometheus collector of :func:`auth_refusals` and :func:`auth_accepts`: the
    counters ``dstl_auth_refusals_total{role}`` and ``dstl_auth_accepts_total{role,
    key}`` (``key``: the client key's fingerprint), and the gauge
    ``dstl_auth_server_keys{serves, accepts}`` (a node's server key fingerprint, its
    accepted clients' fingerprints comma-separated). Register it with a component's
    registry (:func:`register_refusal_metrics`)."""

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        family = CounterMetricFamily(
            "dstl_auth_refusals",
            "CURVE clients refused by this process (unknown public key), by server role.",
            labels=["role"],
        )
        for role, n in sorted(auth_refusals().items()):
            family.add_metric([role], n)
        yield family
        accepts = CounterMetricFamily(
            "dstl_auth_accepts",
            "CURVE handshakes accepted by this process, by server role and client key "
            "fingerprint (dstl keys status).",
            labels=["role", "key"],
        )
        for (role, key), n in sorted(auth_accepts().items()):
            accepts.add_metric([role, key], n)
        yield accepts
        serving = GaugeMetricFamily(
            "dstl_auth_server_keys",
            "1 per node server socket of this process: the fingerprint of the key it "
            "serves with and those of the client keys it accepts (dstl keys status).",
            labels=["serves", "accepts"],
        )
        with _lock:
            for serves, accepted in sorted(_serving.items()):
                serving.add_metric([serves, accepted], 1)
        yield serving


def register_refusal_metrics(registry: CollectorRegistry) -> None:
    """Add the metrics of :class:`RefusalCollector` to ``registry`` (once per
    registry)."""
    registry.register(RefusalCollector())


def stop_authenticator() -> None:
    """Stop this process's authenticator (at exit; idempotent). Servers configured
    afterwards start a new one."""
    global _auth
    with _lock:
        auth, _auth = _auth, None
        _domains.clear()
    if auth is not None and _auth_pid == os.getpid():
        auth.stop()
