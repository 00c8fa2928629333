"""ZeroMQ tcp endpoints of aggregator nodes: parsing, wildcard and loopback hosts. Pure.

An endpoint is ``tcp://HOST:PORT``; HOST is a name, an IPv4 address or a bracketed IPv6
address (``tcp://[::1]:7700``); PORT is 0..65535 (0 or ``*``: a free port at bind time).
"""

from __future__ import annotations

import ipaddress
import re

__all__ = [
    "WILDCARD_HOSTS",
    "check_host",
    "derive_advertise",
    "is_loopback",
    "is_wildcard",
    "split_tcp",
    "tcp_endpoint",
]

# hosts that mean "every interface" in a bind
WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]"})
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*|[A-Za-z0-9_.-]+)$")


def split_tcp(endpoint: str) -> tuple[str, int | None]:
    """``(host, port)`` of ``tcp://host:port``; port None for ``*`` (any free port), host
    without IPv6 brackets. Raises ValueError (message: what is wrong) for anything else,
    including a port outside 0..65535."""
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"not a tcp endpoint (tcp://host:port): {endpoint!r}")
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    if not sep or not host or not port:
        raise ValueError(f"a tcp endpoint needs host and port (tcp://host:port): {endpoint!r}")
    if port == "*":
        return _unbracket(host), None
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be 0..65535 in {endpoint!r}")
    return _unbracket(host), int(port)


def _unbracket(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_wildcard(host: str) -> bool:
    """True for the hosts that bind every interface (``*``, ``0.0.0.0``, ``::``)."""
    return host in WILDCARD_HOSTS


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ``::1``); a name
    other than ``localhost`` is not resolved and counts as not loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(_unbracket(host)).is_loopback
    except ValueError:
        return False


def check_host(host: str) -> None:
    """Raise ValueError unless ``host`` is a host name or an IP address (no scheme,
    port, spaces or wildcard)."""
    if not host or not _HOST.fullmatch(host) or is_wildcard(host):
        raise ValueError(f"not a host name or IP address: {host!r}")


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://host:port``, an IPv6 address in brackets."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def derive_advertise(bind: str, host: str | None) -> str | None:
    """The endpoint others connect to for a node bound to ``bind`` on ``host``: an
    ``ipc://``/``inproc://`` bind itself, a tcp bind naming a concrete host itself, a
    wildcard tcp bind ``tcp://<host>:<port>``; None for ``auto``, a free port (0 or
    ``*``, known only once bound) and a wildcard bind without ``host``. Raises
    ValueError for a malformed tcp endpoint."""
    if bind.startswith(("ipc://", "inproc://")):
        return bind
    if not bind.startswith("tcp://"):
        return None
    bind_host, port = split_tcp(bind)
    if not port:
        return None
    if is_wildcard(bind_host):
        return tcp_endpoint(host, port) if host is not None else None
    return bind
