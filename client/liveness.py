"""Liveness of a peer's event loop through an application-level heartbeat: pure timing.

ZeroMQ's own heartbeats (ZMTP PING/PONG, :mod:`dstltree.client.links`) are answered by
ZeroMQ's I/O thread, so they tell that a peer's process and connection are there, not
that its event loop makes progress: a node whose loop is stuck keeps answering them.
Version 2 of the wire protocol (:mod:`dstltree.client.wire`) adds ``ping``/``pong``: a
writer (towards its node and its probe of a more preferred node) and a node (towards
its parents) ping every ``interval`` seconds, the node answers from its loop, and any
message from the peer counts as a sign of life (an ack, a plan, a pong, an error reply
of a version-1 node that does not know ``ping``).

:class:`PeerLiveness` decides when to ping and when the peer has gone *silent*: no
sign of life for ``timeout`` seconds. Time during which the caller itself did not run
(its own loop stalled, or its process was stopped: a gap between two calls longer than
``interval``, beyond that interval) is not held against the peer, so a loop that comes
back from a stall reads its peers' answers before it judges them. States:

- ``unknown``: since the link opened (or the retry after a refusal), nothing heard yet;
- ``alive``: heard within ``timeout``;
- ``silent``: ``timeout`` passed without a sign of life (reported once, by
  :meth:`PeerLiveness.silent`), or the connection was lost (:meth:`PeerLiveness.lost`);
  the next sign of life makes it ``alive`` again (:meth:`PeerLiveness.heard` says so);
- ``refused``: the peer refused this side's wire versions; no pings, and signs of life
  do not count, until ``retry_after`` seconds later :meth:`PeerLiveness.retry_due` says
  to send a hello again (then ``unknown``).

Times are seconds of the caller's monotonic clock, passed in; no I/O, no threads (the
shells, ``client/node_uploader.py`` and ``aggregator/node.py``, drive it).
"""

from __future__ import annotations

from typing import Literal

State = Literal["unknown", "alive", "silent", "refused"]

DEFAULT_PING_INTERVAL = 0.1  # seconds between two pings
DEFAULT_LIVENESS_TIMEOUT = 0.5  # seconds without a sign of life before the peer is silent


def check_timing(ping_interval: float, liveness_timeout: float) -> None:
    """Raise ValueError unless ``ping_interval`` > 0 and ``liveness_timeout`` >=
    ``ping_interval`` (seconds; a timeout shorter than the interval would call every
    peer silent between two pings)."""
    if not ping_interval > 0:
        raise ValueError(f"ping_interval must be > 0 s, got {ping_interval}")
    if not liveness_timeout >= ping_interval:
        raise ValueError(
            f"liveness_timeout must be >= ping_interval ({ping_interval} s), got {liveness_timeout}"
        )


class PeerLiveness:
    """The heartbeat state of one link, opened at ``now``; see the module docstring.
    Raises ValueError for timings :func:`check_timing` refuses."""

    def __init__(self, now: float, interval: float, timeout: float) -> None:
        check_timing(interval, timeout)
        self.interval = interval
        self.timeout = timeout
        self.state: State = "unknown"
        self._heard = now  # the last sign of life (shifted by the caller's own stalls)
        self._run = now  # the caller's last call
        self._next_ping = now
        self._retry_at = 0.0
        self._seq = 0

    @property
    def alive(self) -> bool:
        return self.state == "alive"

    def heard(self, now: float) -> bool:
        """A message from the peer arrived at ``now``. True if the peer just became
        alive (was unknown or silent); False otherwise, and while refused."""
        if self.state == "refused":
            return False
        self._credit(now)
        self._heard = now
        was = self.state
        self.state = "alive"
        return was != "alive"

    def ping(self, now: float) -> int | None:
        """The sequence number of the ping to send now, or None (not due, or refused)."""
        self._credit(now)
        if self.state == "refused" or now < self._next_ping:
            return None
        # the next one an interval after this one, not after the missed ones
        self._next_ping = max(self._next_ping + self.interval, now + self.interval / 2)
        self._seq += 1
        return self._seq

    def silent(self, now: float) -> bool:
        """True once when ``timeout`` seconds passed without a sign of life (counting
        only time the caller ran): the peer is silent from now on."""
        self._credit(now)
        if self.state in ("silent", "refused") or now - self._heard < self.timeout:
            return False
        self.state = "silent"
        return True

    def lost(self, now: float) -> None:
        """The connection was lost (the caller saw it otherwise): silent, without a
        second report from :meth:`silent`."""
        self._credit(now)
        if self.state != "refused":
            self.state = "silent"

    def refuse(self, now: float, retry_after: float) -> None:
        """The peer refused this side's wire versions at ``now``: no pings, signs of
        life ignored, until :meth:`retry_due` (``retry_after`` seconds)."""
        self._credit(now)
        self.state = "refused"
        self._retry_at = now + retry_after

    def retry_due(self, now: float) -> bool:
        """True once when a refusal's ``retry_after`` has passed (send a hello again):
        the state is ``unknown`` again, the silence counted from ``now``."""
        if self.state != "refused" or now < self._retry_at:
            return False
        self.state = "unknown"
        self._heard = self._run = self._next_ping = now
        return True

    def next_deadline(self) -> float:
        """The earliest time a call may have something to do (a ping, a silence, the
        end of a refusal)."""
        if self.state == "refused":
            return self._retry_at
        if self.state == "silent":
            return self._next_ping
        return min(self._next_ping, self._heard + self.timeout)

    def _credit(self, now: float) -> None:
        """Time the caller did not run (beyond one interval since its last call) is not
        the peer's silence."""
        gap = now - self._run
        if gap > self.interval:
            self._heard += gap - self.interval
        self._run = max(self._run, now)
