"""A DEALER that knows when its peer is gone: ZeroMQ's own heartbeats (ZMTP PING/PONG)
and the socket monitor's connection events (a disconnect, or a connection attempt that
was refused or timed out: a peer already down when the link opens), instead of
waiting out an acknowledgement timeout. Used by a writer towards its nodes and by a
node towards its parents."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

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


@dataclass
class MonitoredDealer:
    """A DEALER connected to one node, with its socket monitor (connection events).
    ``configure`` sets the socket's own options (limits, CURVE) before it connects."""

    address: str
    sock: zmq.Socket
    monitor: zmq.Socket

    @classmethod
    def open(
        cls,
        address: str,
        configure: Callable[[zmq.Socket], None],
        poller: zmq.Poller | None,
        heartbeat: float,
        ctx: zmq.Context | None = None,
    ) -> MonitoredDealer:
        """Connect (asynchronously, as ZeroMQ does) and register socket and monitor
        with ``poller`` when given."""
        sock: zmq.Socket[bytes] = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        configure(sock)
        configure_heartbeat(sock, heartbeat)
        monitor = sock.get_monitor_socket(_LINK_EVENTS)
        monitor.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        if poller is not None:
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
        return cls(address, sock, monitor)

    def changes(self) -> list[bool]:
        """The connection events queued on the monitor, oldest first: True for a
        completed handshake (up), False for a disconnect or a failed connection
        attempt (down)."""
        out = []
        while readable(self.monitor):
            event = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
            out.append(event == zmq.EVENT_HANDSHAKE_SUCCEEDED)
        return out

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
