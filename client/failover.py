"""Which of its nodes a writer sends to: an ordered list, a hold-down before returning.

A writer knows its nodes in order of preference (its executor's node first, then a
neighbour's; FLIP-158 organizes the nodes "into a hierarchy/DAG"). It sends to the
most preferred node it believes alive. When the connection to that node is lost
(ZeroMQ's heartbeats or a disconnect seen by the socket monitor; with wire version 2
also no answer to the writer's pings for the liveness timeout, or a refusal of its
wire versions: see :mod:`dstltree.client.node_uploader`, :mod:`dstltree.client.liveness`)
the node is *down* for ``hold_down`` seconds and the writer moves to the next node. A
more preferred node gets the traffic back only once a probe connection to it has
stayed up (with pings: answered them) for ``hold_down`` seconds, not at its first
heartbeat (a node that flaps does not pull its writers back and forth).

Pure state, times in seconds passed in (the I/O thread of the uploader drives it).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NodePreference:
    """``addresses`` in order of preference (at least one, no repeats); ``current``:
    the index sent to. Raises ValueError for an empty or repeating list or a negative
    ``hold_down``."""

    addresses: tuple[str, ...]
    hold_down: float = 5.0
    current: int = 0
    _down_until: dict[int, float] = field(default_factory=dict)
    _probe_up_since: float | None = None

    def __post_init__(self) -> None:
        if not self.addresses:
            raise ValueError("a writer needs at least one node address")
        if len(set(self.addresses)) != len(self.addresses):
            raise ValueError(f"node addresses repeat: {list(self.addresses)}")
        if self.hold_down < 0:
            raise ValueError(f"hold_down must be >= 0, got {self.hold_down}")

    @property
    def address(self) -> str:
        return self.addresses[self.current]

    def lost(self, now: float) -> int | None:
        """The current node's connection was lost at ``now``: it is down for
        ``hold_down`` s. Returns the index to move to (the most preferred node not
        down, else the next one in order), or None to stay (a single node)."""
        if len(self.addresses) == 1:
            return None
        self._down_until[self.current] = now + self.hold_down
        up = [i for i in range(len(self.addresses)) if self._down_until.get(i, 0.0) <= now]
        nxt = up[0] if up else (self.current + 1) % len(self.addresses)
        return self._move(nxt)

    def all_down(self, now: float) -> bool:
        """Whether every node is within its hold-down at ``now``."""
        return all(self._down_until.get(i, 0.0) > now for i in range(len(self.addresses)))

    def probe_target(self) -> int | None:
        """The most preferred node above the current one (to probe), or None."""
        return 0 if self.current > 0 else None

    def probe_seen(self, up: bool, now: float) -> None:
        """The probe's connection came up (handshake done; with pings, its first answer)
        or went down (or went silent, or refused us) at ``now``."""
        if not up:
            self._probe_up_since = None
        elif self._probe_up_since is None:
            self._probe_up_since = now

    def should_return(self, now: float) -> int | None:
        """The index to return to (the probe target), once its probe has been up for
        ``hold_down`` s and its own hold-down has passed; else None."""
        target = self.probe_target()
        since = self._probe_up_since
        if target is None or since is None or now - since < self.hold_down:
            return None
        if self._down_until.get(target, 0.0) > now:
            return None
        return self._move(target)

    def _move(self, index: int) -> int | None:
        if index == self.current:
            return None
        self.current = index
        self._probe_up_since = None
        return index
