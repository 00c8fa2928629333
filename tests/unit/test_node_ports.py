"""Ports for local nodes lie outside the kernel's ephemeral range, so a restarted node
finds its endpoint free."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dstltree.aggregator.ports import (
    LINUX_DEFAULT_EPHEMERAL,
    candidate_ports,
    ephemeral_range,
    stable_port,
)


def test_the_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)


@pytest.mark.parametrize("text", [None, "", "forty fifty"])
def test_an_unreadable_range_is_the_linux_default(tmp_path: Path, text: str | None) -> None:
    f = tmp_path / "range"
    if text is not None:
        f.write_text(text)
    assert ephemeral_range(f) == LINUX_DEFAULT_EPHEMERAL


def test_candidates_lie_below_the_range_else_above_it() -> None:
    assert candidate_ports((32768, 60999)) == range(10000, 32768)
    assert candidate_ports((1024, 60000)) == range(60001, 65536)
    with pytest.raises(OSError, match="1024-65000"):
        candidate_ports((1024, 65000))


def test_a_stable_port_is_free_and_outside_the_range() -> None:
    low, high = ephemeral_range()
    port = stable_port("127.0.0.1")
    assert not low <= port <= high
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # still free


def test_a_host_that_cannot_be_bound_is_an_os_error() -> None:
    with pytest.raises(OSError):
        stable_port("192.0.2.1", attempts=2)  # TEST-NET-1: not an address of this machine
