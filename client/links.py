"""A DEALER that knows when its peer is gone: ZeroMQ's own heartbeats (ZMTP PING/PONG)
and the socket monitor's connection events (a disconnect, or a connection attempt that
was refused or timed out: a peer already down when the link opens), instead of
waiting out an acknowledgement timeout. Used by a writer towards its nodes and by a
node towards its parents. During a CURVE key rotation, a link tries the server keys it
knows in turn on the same socket (:class:`MonitoredDealer`).

How libzmq (4.3) reports a failed CURVE handshake to the client's monitor, checked
with a client and a server on loopback: a wrong server key (the server cannot open the
client's HELLO and drops the connection) gives HANDSHAKE_FAILED_NO_DETAIL, then
DISCONNECTED, then CONNECT_RETRIED (libzmq retries after its reconnect interval with
the same key, forever); a client key the server's ZAP handler refuses gives
HANDSHAKE_FAILED_AUTH (status 400), then DISCONNECTED, and no retry (the session
ends); a server that is down gives CONNECT_RETRIED alone. After ``sock.disconnect``
of an address whose session waits to retry, that session went on retrying the old key
until the socket was used again (which processes its pending commands)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from dstltree.security.curve import server_keys_of

log = logging.getLogger(__name__)

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # ints: no enum.Flag operation per call


def readable(sock: zmq.Socket) -> bool:
    """A message can be received from ``sock`` now (``EVENTS``: cheaper than a NOBLOCK
    receive that raises zmq.Again). Reading it also re-arms the socket's descriptor
    (``zmq.FD``, edge-triggered) for threads that wait on it."""
    events: int = sock.getsockopt(_EVENTS)  # type: ignore[assignment]  # EVENTS is an int
    return bool(events & _POLLIN)


def configure_heartbeat(sock: zmq.Socket, interval: float) -> None:
    """ZeroMQ's own heartbeats (ZMTP PING/PONG) every ``interval`` s; the connection is
    dropped (a disconnect event) after three intervals without traffic from the peer
    (``HEARTBEAT_IVL``, ``HEARTBEAT_TIMEOUT``, ``HEARTBEAT_TTL``). 0: off."""
    if interval <= 0:
        return
    ivl = max(1, int(interval * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 3 * ivl)
    # a peer host that does not answer the TCP handshake at all fails the attempt (a
    # retried connect) after this long instead of the system's minutes; a peer that
    # stops during the ZMTP (CURVE) handshake, before heartbeats run, is dropped after
    # as long instead of ZeroMQ's default 30 s
    limit = max(MIN_CONNECT_TIMEOUT_MS, 3 * ivl)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, limit)
    sock.setsockopt(zmq.HANDSHAKE_IVL, limit)


MIN_CONNECT_TIMEOUT_MS = 1000
# down: a connection lost, or an attempt refused or timed out (a node that is down
# when the link opens never disconnects); up: a completed (CURVE) handshake
_LINK_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
# with several server keys (a key rotation), also: a TCP connection made (a wake-up to
# end the sessions of the key left), and the handshake failures after which libzmq
# does not retry (a refused client key, a protocol error)
_ROTATION_EVENTS = (
    _LINK_EVENTS
    | zmq.EVENT_CONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
)
_UP, _LOST, _RETRIED = (
    int(zmq.EVENT_HANDSHAKE_SUCCEEDED),
    int(zmq.EVENT_DISCONNECTED),
    int(zmq.EVENT_CONNECT_RETRIED),
)
_ENDED = (int(zmq.EVENT_HANDSHAKE_FAILED_AUTH), int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL))

_working_keys: dict[str, bytes] = {}  # address -> server key of its last handshake
_working_lock = threading.Lock()


def working_key(address: str) -> bytes | None:
    """The server key of this process's last completed handshake with ``address``
    through a link with several keys (None: none yet)."""
    with _working_lock:
        return _working_keys.get(address)


def _in_order(address: str, keys: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """``keys`` with the one that worked last for ``address`` first."""
    known = working_key(address)
    if known is None or known not in keys:
        return keys
    return (known, *(k for k in keys if k != known))


@dataclass
class MonitoredDealer:
    """A DEALER connected to one node, with its socket monitor (connection events).
    ``configure`` sets the socket's own options (limits, CURVE) before it connects.

    During a key rotation the socket knows several server keys
    (:func:`dstltree.security.curve.server_keys_of`): a connection attempt that ends
    before a completed handshake moves the SAME socket to the next key (disconnect,
    ``CURVE_SERVERKEY``, connect; ``switches`` counts them), and the link is reported
    down only once every key failed once in a row. The key of each completed handshake
    is remembered per address (:func:`working_key`) and tried first by the next link.
    Such sockets connect with ``ZMQ_IMMEDIATE``: nothing is queued to a connection
    before its handshake (a send then raises zmq.Again), so a key switch drops no
    message; what ZeroMQ queued for a connection that is then lost goes with it (a
    writer's failover sends its unacknowledged items again anyway). ``lock``: held
    around every use of the socket here when other threads use it under that lock (a
    key switch, or ending the sessions of the key left)."""

    address: str
    sock: zmq.Socket
    monitor: zmq.Socket
    keys: tuple[bytes, ...] = ()  # server keys in the order tried; () = a single key
    lock: AbstractContextManager[Any] | None = None
    switches: int = 0
    _key: int = 0  # index in keys of the one the socket connects with
    _failed: int = 0  # keys failed in a row since the last handshake or down report
    _up: bool = False  # a handshake completed on the current connection
    _lost: bool = False  # a completed connection was lost: its retry is no failed key
    _reap: bool = False  # a key was left: its session ends when the socket is used

    @classmethod
    def open(
        cls,
        address: str,
        configure: Callable[[zmq.Socket], None],
        poller: zmq.Poller | None,
        heartbeat: float,
        ctx: zmq.Context | None = None,
        lock: AbstractContextManager[Any] | None = None,
    ) -> MonitoredDealer:
        """Connect (asynchronously, as ZeroMQ does) and register socket and monitor
        with ``poller`` when given. ``lock``: see the class."""
        sock: zmq.Socket[bytes] = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        configure(sock)
        configure_heartbeat(sock, heartbeat)
        keys = _in_order(address, server_keys_of(sock))
        rotating = len(keys) > 1
        if rotating:
            sock.curve_serverkey = keys[0]
            sock.setsockopt(zmq.IMMEDIATE, 1)
        monitor = sock.get_monitor_socket(_ROTATION_EVENTS if rotating else _LINK_EVENTS)
        monitor.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        if poller is not None:
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
        return cls(address, sock, monitor, keys if rotating else (), lock)

    def changes(self) -> list[bool]:
        """The connection events queued on the monitor, oldest first: True for a
        completed handshake (up), False for a disconnect or a failed connection
        attempt (down; with several server keys, once every key failed in a row)."""
        out: list[bool] = []
        if self._reap:
            self._use_socket()
        before = self.switches  # failures queued behind a switch: the left key's session
        while readable(self.monitor):
            event = int(recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"])
            if not self.keys:
                out.append(event == _UP)
                continue
            change = self._rotation_event(event, self.switches != before)
            if change is not None:
                out.append(change)
        if self._up:
            self._reap = False
        return out

    def _rotation_event(self, event: int, switched: bool) -> bool | None:
        """What ``event`` means to the link's user with several server keys (True up,
        False down, None nothing), switching keys on a failed attempt."""
        if event == _UP:
            self._up, self._failed, self._lost = True, 0, False
            with _working_lock:
                _working_keys[self.address] = self.keys[self._key]
            return True
        if event == _LOST:
            if not self._up:
                return None  # a failed handshake: its retry (or the failure) counts it
            self._up, self._failed, self._lost = False, 0, True
            return False
        if event == _RETRIED and self._lost:
            self._lost = False  # the retry of a lost connection, not a failed key
            return None
        if (event == _RETRIED or event in _ENDED) and not switched:
            return self._failed_attempt()
        return None

    def _failed_attempt(self) -> bool | None:
        """A connection attempt with the current key ended before its handshake: try
        the next key now (None), or report down (False) once every key failed in a
        row; the socket then retries the last key itself (ZeroMQ's reconnect
        interval), and the next failure starts a new round."""
        if self._failed >= len(self.keys):
            self._failed = 0
        self._failed += 1
        if self._failed >= len(self.keys):
            return False
        self._key = (self._key + 1) % len(self.keys)
        log.info(
            "%s: no CURVE handshake; trying server key %d of %d",
            self.address,
            self._key + 1,
            len(self.keys),
        )
        with self.lock or contextlib.nullcontext():
            with contextlib.suppress(zmq.ZMQError):  # ended already (a refused client)
                self.sock.disconnect(self.address)
            self.sock.curve_serverkey = self.keys[self._key]
            self.sock.connect(self.address)
        self.switches += 1
        self._reap = True
        return None

    def _use_socket(self) -> None:
        """Let the socket process its pending commands: the session of a key left ends
        only then (it would retry that key otherwise)."""
        with self.lock or contextlib.nullcontext():
            readable(self.sock)

    def lost(self) -> bool:
        """Whether the monitor reported a disconnect or a failed connection attempt
        since the last call (items in flight to the node may be gone with it, even if
        it is back already)."""
        return False in self.changes()

    def close(self, poller: zmq.Poller | None) -> None:
        for s in (self.sock, self.monitor):
            if poller is not None:
                with contextlib.suppress(KeyError):
                    poller.unregister(s)
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close()  # its LINGER: 0, or a short one when leaving a live node
