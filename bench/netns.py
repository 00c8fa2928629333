"""Hosts with their own network stacks, for tests and benchmarks: one Linux network
namespace per host, each joined by a veth pair to one Linux bridge in this process's
namespace, which stands for the harness's own host (the driver's, the bench's).

Loopback aliases (127.0.0.2, ...) share one stack: a partition cannot be expressed and
a connection to a dead host is refused at once, where across a network it hangs. Here
a host cut off (:meth:`NetHosts.cut`: its veth down) drops every packet to and from it,
and a blackhole route in one host (:meth:`NetHosts.block`) drops what it sends to one
address only: a one-way partition. ``tc netem`` (link latency) is not used.

Needs root and ``ip`` (iproute2); :func:`unavailable` says why not otherwise. Everything
made is named after the harness (``dstl<pid>-<tag>-<host>`` namespaces, ``db<tag>``
bridge, ``dv<tag><i>`` veths) and removed by name in :meth:`NetHosts.close`, also after
a failure; :func:`sweep_stale` removes what a harness whose process died left.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence

from dstltree.aggregator.respawn import pid_alive

__all__ = ["NetHosts", "NetnsError", "sweep_stale", "unavailable"]

_IP_TIMEOUT_S = 10.0  # seconds one ``ip`` command may take
_NS = re.compile(r"^dstl(\d{1,10})-([0-9a-f]{4})-[A-Za-z0-9_.]{1,24}$")
_HOST = re.compile(r"^[A-Za-z0-9_.]{1,24}$")
MAX_HOSTS = 200  # hosts per harness (one /24)


class NetnsError(RuntimeError):
    """An ``ip`` command failed: the command and what it printed."""


def _ip(*args: str, check: bool = True) -> str:
    cmd = ["ip", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False)
    if check and r.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
    return r.stdout


_PROBED: list[str | None] = []  # the answer of unavailable(), once per process


def unavailable() -> str | None:
    """Why this process cannot make hosts of their own (None: it can): root, ``ip``, and
    a namespace, a bridge and a veth pair made and removed once (checked once per
    process)."""
    if not _PROBED:
        _PROBED.append(_probe())
    return _PROBED[0]


def _probe() -> str | None:
    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    tag = secrets.token_hex(2)
    ns, bridge, veth = f"dstl{os.getpid()}-{tag}-probe", f"db{tag}", f"dv{tag}p"
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}x")
        _ip("link", "set", f"{veth}x", "netns", ns)
        _ip("link", "set", veth, "master", bridge)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"cannot make a namespace, bridge and veth pair: {e}"
    finally:
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", veth, check=False)
        _ip("link", "del", bridge, check=False)
    return None


def sweep_stale() -> list[str]:
    """Delete the namespaces and bridges of harnesses whose process is gone; returns the
    namespaces deleted."""
    gone = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split(" ", 1)[0]
        m = _NS.match(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        _ip("netns", "del", name, check=False)
        _ip("link", "del", f"db{m.group(2)}", check=False)
        gone.append(name)
    return gone


class NetHosts:
    """Network namespaces for ``hosts`` (names: letters, digits, ``_`` and ``.``), on
    one bridge whose address (:attr:`gateway`) is this process's host. Raises
    NetnsError when a step fails (what was made is removed first), ValueError for bad
    host names."""

    def __init__(self, hosts: Sequence[str]) -> None:
        if not hosts or len(hosts) > MAX_HOSTS or len(set(hosts)) != len(hosts):
            raise ValueError(f"1..{MAX_HOSTS} distinct host names, got {list(hosts)}")
        for h in hosts:
            if not _HOST.match(h):
                raise ValueError(f"host name {h!r}: letters, digits, _ and . (1-24)")
        sweep_stale()
        self.tag = secrets.token_hex(2)
        self.hosts = tuple(hosts)
        self.bridge = f"db{self.tag}"
        self._net = _free_subnet()
        self._made: list[str] = []  # namespaces made, for close()
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    # -- names and addresses ----------------------------------------------------------
    def namespace(self, host: str) -> str:
        """The namespace of ``host``."""
        return f"dstl{os.getpid()}-{self.tag}-{host}"

    def veth(self, host: str) -> str:
        """The bridge side of ``host``'s veth pair (its link to every other host)."""
        return f"dv{self.tag}{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        """``host``'s IPv4 address."""
        return str(self._net[self.hosts.index(host) + 2])

    @property
    def gateway(self) -> str:
        """The address of this process's host on the bridge."""
        return str(self._net[1])

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program in ``host``'s namespace (``ip netns
        exec`` execs it: the PID is the program's)."""
        return ["ip", "netns", "exec", self.namespace(host)]

    # -- faults -----------------------------------------------------------------------
    def cut(self, host: str) -> None:
        """Cut ``host`` off from every other host and from this one (its link down)."""
        _ip("link", "set", self.veth(host), "down")

    def heal(self, host: str) -> None:
        """Join ``host`` again."""
        _ip("link", "set", self.veth(host), "up")

    def block(self, host: str, to: str) -> None:
        """Drop what ``host`` sends to ``to`` (a host name, or ``"gateway"``); ``to``
        still reaches ``host``: a one-way partition."""
        _ip("-n", self.namespace(host), "route", "add", "blackhole", self._target(to))

    def unblock(self, host: str, to: str) -> None:
        """Undo :meth:`block`."""
        _ip("-n", self.namespace(host), "route", "del", "blackhole", self._target(to))

    def _target(self, to: str) -> str:
        return (self.gateway if to == "gateway" else self.address(to)) + "/32"

    # -- lifecycle --------------------------------------------------------------------
    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self._net.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            ns, veth = self.namespace(host), self.veth(host)
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _ip("link", "set", f"{veth}p", "netns", ns)
            _ip("-n", ns, "link", "set", f"{veth}p", "name", "eth0")
            _ip(
                "-n",
                ns,
                "addr",
                "add",
                f"{self.address(host)}/{self._net.prefixlen}",
                "dev",
                "eth0",
            )
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.gateway)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")

    def close(self) -> list[str]:
        """Remove every namespace (their veth pairs go with them) and the bridge, by
        name; returns what could not be removed (empty when all went)."""
        for ns in self._made:
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)
        names = {line.split(" ", 1)[0] for line in _ip("netns", "list", check=False).splitlines()}
        left = [ns for ns in self._made if ns in names]
        if _ip("link", "show", self.bridge, check=False).strip():
            left.append(self.bridge)
        self._made = []
        return left

    def __enter__(self) -> NetHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.128.0.0/9 that no route of this host covers yet."""
    routes = _ip("-4", "route", "show", "table", "all", check=False)
    taken = [
        ipaddress.ip_network(w, strict=False) for w in re.findall(r"\d+\.\d+\.\d+\.\d+/\d+", routes)
    ]
    for _ in range(64):
        n = secrets.randbelow(1 << 15)
        net = ipaddress.IPv4Network(f"10.{128 + (n >> 8)}.{n & 255}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise NetnsError("no free /24 in 10.128.0.0/9 for the harness")
