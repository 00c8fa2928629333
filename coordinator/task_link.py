"""The task side of the coordinator protocol, used inside a Spark task.

A :class:`TaskLink` is a DEALER socket connected to :attr:`Coordinator.address`. It says
hello on connect (so the coordinator can push commands to it), then the task polls for
commands between records and answers them. Not thread-safe: use one link per thread.
"""

from __future__ import annotations

import os

import zmq

from dstltree.client.errors import WireError
from dstltree.coordinator import protocol
from dstltree.coordinator.checkpoint import MaterializedRef, TaskCheckpoint
from dstltree.coordinator.errors import CoordinatorError
from dstltree.coordinator.protocol import Command
from dstltree.security.curve import Curve, configure_client


class TaskLink:
    """Link of task ``task`` of attempt ``attempt`` to the coordinator at ``address``.

    ``send_timeout``: seconds a send may wait (raises CoordinatorError after it);
    ``linger``: seconds :meth:`close` waits to deliver queued messages; ``node``: the
    endpoint of the task's aggregator node ("" = it writes straight to the DFS).
    ``security``: CURVE with the per-job keys (the coordinator's); None = plaintext.
    """

    def __init__(
        self,
        address: str,
        task: int,
        attempt: int,
        *,
        send_timeout: float = 5.0,
        linger: float = 1.0,
        node: str = "",
        security: Curve | None = None,
    ) -> None:
        self.address = address
        self.task = task
        self.attempt = attempt
        self.fenced = False
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        # A random routing id of its own: the coordinator binds the task to it, and a
        # reconnect keeps it (never starts with a zero byte, reserved by ZeroMQ).
        self._sock.setsockopt(zmq.ROUTING_ID, b"t" + os.urandom(15))
        self._sock.setsockopt(zmq.LINGER, int(linger * 1000))
        self._sock.setsockopt(zmq.SNDTIMEO, int(send_timeout * 1000))
        self._sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        configure_client(self._sock, security)
        self._sock.connect(address)
        try:
            self._send(protocol.Hello(task, attempt, node))
        except CoordinatorError:
            self._sock.close(0)
            raise

    def poll(self, timeout: float = 0.0) -> list[Command]:
        """Commands received so far, in order; waits up to ``timeout`` seconds (default:
        not at all) for the first one. Commands are TriggerCheckpoint, Materialize,
        ApplyMaterialization, AssignSplits, CheckpointComplete, Finish, plus Fenced
        (this attempt is stale: stop) and ErrorReply (a message of this link was
        rejected). Undecodable frames become ErrorReply."""
        out: list[Command] = []
        if timeout > 0 and not self._sock.poll(int(timeout * 1000), zmq.POLLIN):
            return out
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                if len(frames) != 1:
                    raise WireError(f"expected 1 frame, got {len(frames)}")
                msg = protocol.load(frames[0])
            except WireError as e:
                out.append(protocol.ErrorReply(f"from coordinator: {e}"))
                continue
            if isinstance(msg, protocol.Fenced):
                self.fenced = True
            if isinstance(msg, protocol.COMMANDS):
                out.append(msg)
            else:
                out.append(protocol.ErrorReply(f"unexpected {type(msg).__name__}"))

    def ack_checkpoint(self, checkpoint_id: int, checkpoint: TaskCheckpoint) -> None:
        """Acknowledge ``checkpoint_id`` with this task's state. Raises ValueError if the
        record names another task or attempt, CoordinatorError if it cannot be sent."""
        if checkpoint.task != self.task or checkpoint.attempt != self.attempt:
            raise ValueError(
                f"checkpoint of task {checkpoint.task} attempt {checkpoint.attempt} "
                f"sent by task {self.task} attempt {self.attempt}"
            )
        self._send(protocol.Ack(self.task, self.attempt, checkpoint_id, checkpoint))

    def splits_finished(self, split_ids: tuple[str, ...]) -> None:
        """Tell the enumerator these assigned splits are consumed to their end."""
        self._send(protocol.SplitsFinished(self.task, self.attempt, split_ids))

    def report_materialization(self, epoch: int, ref: MaterializedRef) -> None:
        """Report this task's uploaded snapshot for materialization ``epoch``."""
        self._send(protocol.Report(self.task, self.attempt, epoch, ref))

    def _send(self, msg: protocol.Message) -> None:
        try:
            self._sock.send(protocol.dump(msg))
        except zmq.Again as e:
            raise CoordinatorError(f"coordinator at {self.address} is not receiving") from e

    def close(self) -> None:
        """Close the socket (queued messages get ``linger`` seconds to go out)."""
        self._sock.close()

    def __enter__(self) -> TaskLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
