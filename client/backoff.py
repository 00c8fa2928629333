"""When a writer with one node tries that node again after it left items
unacknowledged: the down mark and its backoff, pure (no I/O, no threads; times are the
caller's monotonic clock, in seconds).

The rule, as :class:`~dstltree.client.node_uploader.NodeUploader` applies it:

- an item *sent since the current mark began* and not acknowledged within the ack
  timeout marks the node down for ``down_for`` seconds; the next mark lasts twice as
  long (up to ``max_retry_after``). Items sent before the mark began belong to the
  outage already marked: they expire without doubling it again (before, every I/O loop
  turn that found expired items doubled it, 5 s to 60 s within a second);
- an acknowledgement ends a mark taken for a silence and resets ``down_for``: the
  writer is back on the node at once, not when the mark runs out;
- other answers (replies to pings) end it once the node has answered for ``hold_down``
  seconds without a gap longer than ``gap`` (its liveness timeout), as a preferred node
  gets the traffic back after a failover (:mod:`dstltree.client.failover`): a node that
  answers pings and acknowledges nothing does not draw every item into an ack timeout;
- a refusal of the writer's wire versions marks the node down for ``down_for`` without
  doubling; the node's answers do not end that mark (a refusing node still answers).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeBackoff"]

_NEVER = float("-inf")


@dataclass
class NodeBackoff:
    """The down mark of one node. ``retry_after``, ``max_retry_after``, ``hold_down``
    and ``gap`` in seconds (``max_retry_after`` below ``retry_after`` is taken as
    ``retry_after``). Raises ValueError for a ``retry_after`` or ``gap`` not above 0."""

    retry_after: float
    max_retry_after: float
    hold_down: float = 5.0
    gap: float = 1.0
    down_for: float = 0.0  # the next mark's length (retry_after until a silence)
    down_until: float = _NEVER  # items go to the DFS directly before this time
    marked_at: float = _NEVER  # when the current (or last) mark began
    reason: str = ""  # "silence" or "refused" while marked
    heard_since: float = _NEVER  # answers without a longer gap than ``gap`` since
    heard_at: float = _NEVER  # the node's latest answer

    def __post_init__(self) -> None:
        if self.retry_after <= 0 or self.gap <= 0:
            raise ValueError(f"retry_after and gap must be > 0 s: {self.retry_after}, {self.gap}")
        self.max_retry_after = max(self.max_retry_after, self.retry_after)
        if self.down_for <= 0:
            self.down_for = self.retry_after

    def down(self, now: float) -> bool:
        """Whether items submitted at ``now`` go to the DFS directly."""
        return now < self.down_until

    def expired(self, sent_at: float, now: float) -> bool:
        """An item sent at ``sent_at`` got no acknowledgement by ``now``; True when this
        began a new mark (False: the item belongs to the outage already marked)."""
        if sent_at < self.marked_at:
            return False
        self._mark(now, "silence")
        self.down_for = min(self.down_for * 2, self.max_retry_after)
        return True

    def refused(self, now: float) -> None:
        """The node refused the writer's wire versions at ``now``."""
        self._mark(now, "refused")

    def acked(self, now: float) -> bool:
        """The node acknowledged an item at ``now``; True when this ended a mark for a
        silence."""
        self.heard(now)
        self.down_for = self.retry_after
        return self._end_silence(now)

    def heard(self, now: float) -> bool:
        """The node answered at ``now`` (any message); True when this ended a mark for
        a silence (it answered for ``hold_down`` s)."""
        if now - self.heard_at > self.gap:
            self.heard_since = now
        self.heard_at = now
        if now - self.heard_since < self.hold_down:
            return False
        return self._end_silence(now)

    def _end_silence(self, now: float) -> bool:
        if self.reason != "silence" or not self.down(now):
            return False
        self.down_until, self.reason = now, ""
        return True

    def _mark(self, now: float, reason: str) -> None:
        self.marked_at, self.down_until, self.reason = now, now + self.down_for, reason
        self.heard_since = self.heard_at = _NEVER  # answers count from the mark on

    def validate(self) -> None:
        """Check the invariants; raises AssertionError."""
        assert 0 < self.retry_after <= self.down_for <= self.max_retry_after, self
        assert self.down_until == _NEVER or self.down_until >= self.marked_at, self
        assert self.reason in ("", "silence", "refused"), self
        assert self.heard_since <= self.heard_at, self
