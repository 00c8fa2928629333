"""The topologies shipped with the package, named by short names.

``topology/topologies/<name>.yaml`` is package data (the checkout's ``deploy/<name>.yaml``
are links to the same files): ``local`` (the demo's 7-node DAG on this machine), ``s3``
(the same on an object store, uploads hedged), ``bench``, ``cluster`` (by branching) and
``cluster-hosts`` (one node per host). :func:`topology_path` accepts a short name or a
path, so ``configure(builder, topology="local")``, ``dstl up local`` and
``--topology deploy/local.yaml`` all work, from a checkout and from an installed wheel.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from dstltree.topology.tree import TopologyError

SHORT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
"""What a short name looks like: lower-case letters, digits, ``-`` and ``_``."""


def shipped_dir() -> Path:
    """The folder of the shipped topologies (inside the installed package)."""
    return Path(str(resources.files("dstltree.topology.topologies")))


def named_topologies() -> dict[str, Path]:
    """Short name -> file of every shipped topology, sorted by name."""
    return {p.stem: p for p in sorted(shipped_dir().glob("*.yaml"))}


def topology_path(spec: str | Path) -> Path:
    """The topology file that ``spec`` names: an existing file as it is, else a short
    name of a shipped topology (``"local"``; ``"local.yaml"`` too).

    Raises :class:`TopologyError` naming the shipped names when ``spec`` is neither
    ("cannot read ..." when ``spec`` looks like a path: a folder in it or ``.yaml``)."""
    p = Path(spec)
    if p.is_file():
        return p
    name = p.name.removesuffix(".yaml") if p.parent == Path(".") else ""
    if SHORT_NAME.match(name):
        found = named_topologies().get(name)
        if found is not None:
            return found
    names = ", ".join(named_topologies()) or "none"
    if name and p.suffix != ".yaml":
        raise TopologyError(f"{spec}: no shipped topology of that name (shipped: {names})")
    raise TopologyError(f"cannot read {spec}: no such file (shipped: {names})")
