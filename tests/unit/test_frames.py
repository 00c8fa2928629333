"""Multipart sends and receives with int flags (client/frames.py), on real sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from dstltree.client.frames import NOBLOCK, recv_frames, send_frames


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield router, dealer
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()


def test_a_message_arrives_whole_with_its_frames_in_order(
    pair: tuple[zmq.Socket, zmq.Socket],
) -> None:
    router, dealer = pair
    body = memoryview(b"x" * 70_000)
    send_frames(dealer, [b"header", body, zmq.Frame(b"tail")], copy=False)
    assert router.poll(10_000)
    identity, *rest = recv_frames(router)
    assert [f.bytes for f in rest] == [b"header", bytes(body), b"tail"]
    send_frames(router, [identity.bytes, b"ack"], NOBLOCK)
    assert dealer.poll(10_000)
    assert [f.bytes for f in recv_frames(dealer)] == [b"ack"]


def test_nothing_waiting_raises_again_without_blocking(
    pair: tuple[zmq.Socket, zmq.Socket],
) -> None:
    router, _ = pair
    with pytest.raises(zmq.Again):
        recv_frames(router, NOBLOCK)


def test_a_message_needs_a_frame(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    _, dealer = pair
    with pytest.raises(ValueError, match="at least one frame"):
        send_frames(dealer, [])
