"""``ChangelogClient.close`` is idempotent, also after its uploader was closed first:
it closes quietly and loses nothing (every persist started resolves and reads back)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dstltree.client import ChangelogClient
from dstltree.client.errors import DstlError


def _unused_endpoint() -> str:
    """A loopback endpoint nothing listens on (the client's persists then fall back to
    DFS after its ack timeout)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("via_node", [True, False])
def test_close_after_the_uploader_was_closed_is_quiet_and_loses_nothing(
    tmp_path: Path, via_node: bool
) -> None:
    node = _unused_endpoint() if via_node else None
    client = ChangelogClient.open(str(tmp_path), node=node, ack_timeout=0.3)
    first, second = client.create_writer("w0", range(2)), client.create_writer("w1", range(2))
    first.append(0, b"durable")
    done = first.persist_durably(0).result(timeout=20)
    second.append(1, b"in flight")
    pending = second.persist_durably(0)  # not awaited: the uploader's close waits for it
    client.uploader.close()
    client.close()  # no DstlError: the writers are closed all the same
    client.close()  # idempotent
    with pytest.raises(DstlError):
        first.append(0, b"after close")
    with pytest.raises(DstlError):
        second.append(1, b"after close")
    reader = ChangelogClient.open(str(tmp_path))
    try:
        assert list(reader.read_changes(done, 0)) == [b"durable"]
        assert list(reader.read_changes(pending.result(timeout=20), 1)) == [b"in flight"]
    finally:
        reader.close()


def test_close_twice_in_the_usual_order(tmp_path: Path) -> None:
    client = ChangelogClient.open(str(tmp_path), node=_unused_endpoint(), ack_timeout=0.3)
    w = client.create_writer("w", range(1))
    w.append(0, b"x")
    handle = w.persist_durably(0).result(timeout=20)
    client.close()
    client.close()
    client.uploader.close()  # the uploader's own close after the client's: quiet too
    reader = ChangelogClient.open(str(tmp_path))
    try:
        assert list(reader.read_changes(handle, 0)) == [b"x"]
    finally:
        reader.close()
