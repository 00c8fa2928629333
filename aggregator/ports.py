"""Ports a local node can bind again after it was killed.

A port that the kernel handed out for ``tcp://HOST:0`` lies in its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``): once its node dies, any outgoing
connection on the machine may be given it as a local port, and the node restarted on
its old endpoint then fails to bind. Ports below that range are only taken by an
explicit bind."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
LOWEST = 10000  # below this: well-known and registered services


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range, inclusive (the Linux default when unreadable)."""
    try:
        low, high = (int(x) for x in path.read_text().split()[:2])
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL
    return low, high


def candidate_ports(rng: tuple[int, int]) -> range:
    """Ports outside the ephemeral range ``rng`` a node may take: below it, else above it.
    Raises OSError when the range leaves none."""
    low, high = rng
    if low - LOWEST >= 1000:
        return range(LOWEST, low)
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    raise OSError(f"the ephemeral port range {low}-{high} leaves no ports for nodes")


def stable_port(host: str = "127.0.0.1", attempts: int = 64) -> int:
    """A port on ``host`` that was free a moment ago and lies outside the ephemeral range,
    so that a node restarted on it later finds it free. Raises OSError when ``attempts``
    random candidates were all taken or ``host`` cannot be bound."""
    ports = candidate_ports(ephemeral_range())
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    last: OSError | None = None
    for port in random.sample(ports, min(attempts, len(ports))):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as e:
                last = e
                continue
            return port
    raise OSError(f"no free port on {host} outside the ephemeral range: {last}")
