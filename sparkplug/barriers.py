"""Checkpoint barriers over the input channels of a keyed operator, aligned or unaligned
(Flink aligned checkpoints; FLIP-76, "Unaligned checkpoints"). Pure: no I/O, time
comes in as arguments.

Every sender puts barrier ``cp`` on every channel after the records it sent before
checkpoint ``cp`` and before those it sends after, in increasing checkpoint order.
What the receiver does with the records between the first barrier of ``cp`` on some
channel and the barriers still owed by the others depends on the mode:

- **aligned**: a channel that delivered ``cp`` is blocked (not read) until every
  channel did; then the operator takes its snapshot: every record before the barriers
  is in the state, none after. The slowest channel holds every checkpoint.
- **unaligned**: the operator takes its snapshot at the first barrier of ``cp``; no
  channel is blocked by ``cp``. The records that still arrive on a channel before its
  barrier ``cp`` were sent before the checkpoint but are not in the snapshot: they are
  the checkpoint's *input channel state* (:meth:`CheckpointBarriers.inflight_for`),
  persisted and processed again first on recovery (FLIP-76, "Recovery").
- **aligned with a timeout** (``aligned_timeout`` > 0, Flink's
  ``aligned-checkpoint-timeout``): a checkpoint starts aligned; once its alignment has
  taken ``aligned_timeout`` seconds (:meth:`CheckpointBarriers.on_time`) it switches
  to unaligned: snapshot at once, blocked channels released, the records still owed
  by the others become its channel state.

A barrier can demand alignment (``aligned=True``): its checkpoint is taken aligned
whatever the mode, as the final checkpoint of a run must be (every record read before
it is processed before the job ends; Flink takes savepoints and final checkpoints
aligned, FLIP-147).

One checkpoint is pending at a time: a channel that delivers the barrier of a later
checkpoint while one is pending is blocked until the pending one has every barrier
(as Flink, unaligned checkpoints are not concurrent within a task); that barrier is
then taken up at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from dstltree.storage.errors import DstlError

Mode: TypeAlias = Literal["aligned", "unaligned"]
MODES: tuple[Mode, ...] = ("aligned", "unaligned")


class ExchangeError(DstlError):
    """The exchange received something it cannot accept: a malformed frame, or a barrier
    out of order. The message names the input channel (the sending task)."""


@dataclass(frozen=True, slots=True)
class TakeSnapshot:
    """The keyed operator takes its snapshot of checkpoint ``checkpoint_id`` now:
    ``unaligned`` False when every channel delivered the barrier (aligned), True at the
    first barrier (unaligned) or when the alignment timed out. ``first_barrier_at``:
    when the first barrier of the checkpoint arrived (the caller's clock, seconds)."""

    checkpoint_id: int
    unaligned: bool
    first_barrier_at: float


@dataclass(frozen=True, slots=True)
class BarriersComplete:
    """Barrier ``checkpoint_id`` arrived on every input channel: its channel state is
    complete. ``alignment_s``: seconds from its first barrier to its last."""

    checkpoint_id: int
    alignment_s: float


BarrierEvent: TypeAlias = TakeSnapshot | BarriersComplete


class CheckpointBarriers:
    """The barriers of ``channels`` input channels in ``mode`` (module docstring);
    ``aligned_timeout`` (seconds, 0: none) only with ``mode="unaligned"``: start each
    checkpoint aligned and switch after that long. Raises ValueError for bad
    arguments."""

    def __init__(self, channels: int, mode: Mode = "aligned", aligned_timeout: float = 0.0):
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if aligned_timeout < 0 or (aligned_timeout > 0 and mode != "unaligned"):
            raise ValueError(
                "aligned_timeout must be >= 0, and > 0 only with mode 'unaligned' (start "
                "aligned, switch to unaligned after it)"
            )
        self.channels = channels
        self.mode: Mode = mode
        self.aligned_timeout = aligned_timeout
        self._last: list[int | None] = [None] * channels
        self._arrived = [False] * channels
        self._count = 0
        self._pending: int | None = None
        self._first_at = 0.0
        self._unaligned = False  # the pending checkpoint's snapshot was taken unaligned
        self._forced = False  # the pending checkpoint's barriers demand alignment
        # channel -> (checkpoint, demands alignment) of a barrier of a later checkpoint
        self._held: dict[int, tuple[int, bool]] = {}

    @property
    def pending(self) -> int | None:
        """The checkpoint whose barrier arrived on some channels, not all, or None."""
        return self._pending

    @property
    def unaligned(self) -> bool:
        """True while the pending checkpoint collects channel state (its snapshot was
        taken unaligned)."""
        return self._pending is not None and self._unaligned

    def blocked(self, channel: int) -> bool:
        """True while ``channel`` must not be read: it delivered the barrier of the
        pending aligned checkpoint, or of a later checkpoint than the pending one."""
        if channel in self._held:
            return True
        return self._pending is not None and not self._unaligned and self._arrived[channel]

    def inflight_for(self, channel: int) -> int | None:
        """The checkpoint whose input channel state a record read now from ``channel``
        belongs to (it was sent before that barrier, and the snapshot was taken
        without it), or None."""
        if self._unaligned and self._pending is not None and not self._arrived[channel]:
            return self._pending
        return None

    def owing(self) -> list[int]:
        """The channels whose records are channel state now (see :meth:`inflight_for`)."""
        if not self.unaligned:
            return []
        return [c for c in range(self.channels) if not self._arrived[c]]

    def on_barrier(
        self, channel: int, cp: int, now: float, aligned: bool = False
    ) -> list[BarrierEvent]:
        """Barrier ``cp`` arrived on ``channel`` (0..channels-1) at ``now`` (seconds);
        ``aligned``: it demands alignment (module docstring; the first barrier of a
        checkpoint decides). Returns what follows from it, in order. Raises
        ExchangeError for a barrier out of order: a checkpoint id not greater than the
        channel's last, a barrier on a blocked channel, or one that skips the pending
        checkpoint; IndexError for a
        bad channel."""
        last = self._last[channel]
        if channel in self._held or (self.blocked(channel) and self._arrived[channel]):
            raise ExchangeError(
                f"channel {channel}: barrier {cp} while blocked on checkpoint {self._pending}"
            )
        if last is not None and cp <= last:
            raise ExchangeError(
                f"channel {channel}: barrier {cp} after barrier {last} (checkpoint ids "
                "must increase)"
            )
        pending = self._pending
        if pending is not None and cp != pending:
            if not self._arrived[channel]:
                raise ExchangeError(
                    f"channel {channel}: barrier {cp} while checkpoint {pending} is pending"
                )
            self._last[channel] = cp
            self._held[channel] = (cp, aligned)
            return []
        self._last[channel] = cp
        return self._arrive(channel, cp, now, aligned)

    def on_time(self, now: float) -> list[BarrierEvent]:
        """The clock moved to ``now``: the pending aligned checkpoint switches to
        unaligned once its alignment took ``aligned_timeout`` seconds."""
        if (
            self._pending is None
            or self._unaligned
            or self._forced
            or self.aligned_timeout <= 0
            or now - self._first_at < self.aligned_timeout
        ):
            return []
        self._unaligned = True
        return [TakeSnapshot(self._pending, True, self._first_at)]

    def _arrive(self, channel: int, cp: int, now: float, aligned: bool) -> list[BarrierEvent]:
        out: list[BarrierEvent] = []
        if self._pending is None:
            self._pending, self._first_at, self._forced = cp, now, aligned
            self._unaligned = self.mode == "unaligned" and self.aligned_timeout <= 0 and not aligned
            if self._unaligned:
                out.append(TakeSnapshot(cp, True, now))
        self._arrived[channel] = True
        self._count += 1
        if self._count < self.channels:
            return out
        if not self._unaligned:
            out.append(TakeSnapshot(cp, False, self._first_at))
        out.append(BarriersComplete(cp, max(0.0, now - self._first_at)))
        self._pending, self._unaligned, self._count = None, False, 0
        self._arrived = [False] * self.channels
        held, self._held = self._held, {}
        for c in sorted(held):  # their barriers arrived while the last one was pending
            cp_held, forced = held[c]
            if self._pending is not None and cp_held != self._pending:
                raise ExchangeError(
                    f"channel {c}: barrier {cp_held} while checkpoint {self._pending} is pending"
                )
            out.extend(self._arrive(c, cp_held, now, forced))
        return out
