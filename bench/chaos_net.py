"""The chaos benchmark's network faults (``--faults partitions,oneway``), on hosts with
their own network stacks (dstltree.bench.netns): every node of the topology in a
namespace of its own, the writers on the benchmark's host (the bridge's address).

- ``partitions``: a node's host cut off from every other host and from the writers
  (its link down) for ``cut_min`` to ``cut_max`` seconds, the root included: packets
  are dropped, connections hang (no refusal, no reset).
- ``oneway``: one direction between a node below the root and its first parent dropped
  (a blackhole route in one of the two hosts): either the node sends and never hears
  back, or the parent hears and cannot answer; the node's pings tell it.

Pure choices (:func:`choose`) are taken from the run's seeded random generator; the
shell (:func:`apply`) returns how to undo what it did.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dstltree.bench.netns import NetHosts

__all__ = ["NET_FAULTS", "PORT", "NetFault", "apply", "choose", "node_specs"]

NET_FAULTS = ("partitions", "oneway")
PORT = 7100  # every node's port: each host has a stack of its own


@dataclass(frozen=True)
class NetFault:
    """What to do: ``kind`` on ``node`` (for ``oneway`` the node below, ``parent`` its
    first parent, ``up``: True drops what the node sends to the parent, False what the
    parent sends to it), for ``seconds``."""

    kind: str
    node: str
    seconds: float
    parent: str | None = None
    up: bool = False


def node_specs(hosts: NetHosts, parents: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The topology's ``nodes`` with each node bound to its own host's address."""
    out = []
    for n, p in parents.items():
        spec: dict[str, Any] = {"id": n, "bind": f"tcp://{hosts.address(n)}:{PORT}"}
        if p:
            spec["parents"] = p
        out.append(spec)
    return out


def choose(
    kind: str,
    rng: random.Random,
    parents: dict[str, list[str]],
    busy: set[str],
    seconds: tuple[float, float],
) -> NetFault | None:
    """A fault of ``kind`` on a node not in ``busy`` (None: every candidate is); its
    length uniform in ``seconds``."""
    if kind == "partitions":
        names = sorted(n for n in parents if n not in busy)
    else:
        names = sorted(n for n, p in parents.items() if p and n not in busy and p[0] not in busy)
    if not names:
        return None
    node = rng.choice(names)
    length = rng.uniform(*seconds)
    if kind == "partitions":
        return NetFault(kind, node, length)
    return NetFault(kind, node, length, parents[node][0], rng.random() < 0.5)


def apply(hosts: NetHosts, fault: NetFault) -> Callable[[], None]:
    """Apply ``fault``; returns what undoes it."""
    if fault.kind == "partitions":
        hosts.cut(fault.node)
        return lambda: hosts.heal(fault.node)
    assert fault.parent is not None
    src, dst = (fault.node, fault.parent) if fault.up else (fault.parent, fault.node)
    hosts.block(src, dst)
    return lambda: hosts.unblock(src, dst)
