"""Asynchronous checkpoints of one task: the synchronous phase at the barrier, the
acknowledgement once the changelog is durable (Flink's synchronous and asynchronous
checkpoint phases; the Flink 1.15 changelog blog post).

At an aligned barrier the task records its changelog's SQN and starts the persist
(``ChangelogWriter.persist_durably``), stages its sink output and builds its
:class:`~dstltree.coordinator.checkpoint.TaskCheckpoint`; then it goes on processing.
:class:`PendingAcks` holds those checkpoints and sends each acknowledgement, with the
persist's handle added, once its persist completed, in checkpoint order, on the task's
own thread (never from a future's callback thread).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

from dstltree.client.handle import ChangelogHandle
from dstltree.coordinator.checkpoint import TaskCheckpoint

__all__ = ["PendingAcks"]

Ack = Callable[[int, TaskCheckpoint], None]


@dataclass(frozen=True)
class _AwaitingPersist:
    checkpoint_id: int
    state: TaskCheckpoint  # without the persist's handle
    persisted: Future[ChangelogHandle] | None
    deadline: float  # monotonic seconds
    channel: Future[ChangelogHandle] | None = None  # the channel state's persist


class PendingAcks:
    """Checkpoints whose acknowledgement waits for their persist; ``ack(checkpoint_id,
    state)`` sends one. At most ``limit`` (>= 1) wait: :meth:`add` beyond it blocks on
    the oldest (back-pressure: nothing is dropped). A persist not done ``timeout``
    seconds after its barrier raises TimeoutError, a failed one its error (PersistError):
    the task fails and is recovered from the latest completed checkpoint."""

    def __init__(
        self,
        ack: Ack,
        limit: int = 2,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1 or timeout <= 0:
            raise ValueError(f"limit must be >= 1 and timeout > 0, got {limit}, {timeout}")
        self._ack, self.limit, self.timeout, self._clock = ack, limit, timeout, clock
        self._pending: deque[_AwaitingPersist] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def add(
        self,
        checkpoint_id: int,
        state: TaskCheckpoint,
        persisted: Future[ChangelogHandle] | None,
        channel: Future[ChangelogHandle] | None = None,
    ) -> None:
        """Checkpoint ``checkpoint_id``'s synchronous phase is done: ``state`` is its
        acknowledgement without the changelog handle ``persisted`` will give (None: no
        changelog) and the channel-state handle ``channel`` will give (None: none;
        sparkplug/channel_state.py). Sends what is ready; blocks while more than
        ``limit`` wait."""
        deadline = self._clock() + self.timeout
        self._pending.append(_AwaitingPersist(checkpoint_id, state, persisted, deadline, channel))
        self.send_ready()
        while len(self._pending) > self.limit:
            self._send_oldest(block=True)

    def send_ready(self) -> int:
        """Send the acknowledgements whose persists completed, oldest first, stopping at
        the first still running (its deadline checked). Returns how many were sent."""
        sent = 0
        while self._pending and self._send_oldest(block=False):
            sent += 1
        return sent

    def _send_oldest(self, block: bool) -> bool:
        p = self._pending[0]
        f = p.persisted
        handle: ChangelogHandle | None
        if any(x is not None and not x.done() for x in (f, p.channel)):
            left = p.deadline - self._clock()
            if left <= 0:
                raise TimeoutError(
                    f"checkpoint {p.checkpoint_id}: the changelog persist took more than "
                    f"{self.timeout} s"
                )
            if not block:
                return False
        # a failed persist raises here; a blocking wait past the deadline: TimeoutError
        handle = None if f is None else f.result(timeout=p.deadline - self._clock())
        channel = None if p.channel is None else p.channel.result(p.deadline - self._clock())
        self._pending.popleft()
        started = p.deadline - self.timeout  # the barrier's synchronous phase ended
        changelog = p.state.changelog if handle is None else (*p.state.changelog, handle)
        channel_state = p.state.channel_state
        if channel is not None and any(not s.meta.is_marker for s in channel.segments):
            channel_state = (*channel_state, channel)
        state = replace(
            p.state,
            changelog=changelog,
            channel_state=channel_state,
            async_s=round(max(0.0, self._clock() - started), 6),
        )
        self._ack(p.checkpoint_id, state)
        return True
