"""Multipart sends and receives on the hot path with plain-int flags.

pyzmq's ``send_multipart`` ORs ``zmq.SNDMORE`` into the flags for every frame but the
last, and ``recv_multipart`` asks ``getsockopt(zmq.RCVMORE)`` after every frame; both
go through Python's ``enum.Flag`` machinery, about 1 µs each. These do the same with
int constants and, on receive, the ``more`` flag ZeroMQ hands back with each frame
(``zmq.Frame.more``). Same semantics as pyzmq's: ZeroMQ delivers a multipart message
whole or not at all, so a send refused for a full queue (``zmq.Again``) is refused at
its first frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0, copy: bool = True) -> None:
    """Send ``frames`` (bytes, memoryview or zmq.Frame; at least one) as one message
    with ``flags`` (an int, e.g. :data:`NOBLOCK`). Raises zmq.Again (full queue,
    nothing sent) or zmq.ZMQError as ``Socket.send``; ValueError for no frames."""
    if not frames:
        raise ValueError("a message needs at least one frame")
    more = flags | SNDMORE
    last = len(frames) - 1
    for i in range(last):
        sock.send(frames[i], more, copy=copy)
    sock.send(frames[last], flags, copy=copy)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """Receive one whole message as zmq.Frames (no copy), with ``flags`` (an int) on
    its first frame. Raises zmq.Again (nothing waiting, with :data:`NOBLOCK`) or
    zmq.ZMQError as ``Socket.recv``."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(0, copy=False)
        frames.append(frame)
    return frames
