"""Parsing and printing shared by several ``dstl`` commands (``bench``, ``plan``,
``simulate``); no command of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from dstltree.topology.config import TopologyConfig
    from dstltree.topology.tree import Tree

__all__ = [
    "echo_json",
    "exit_topology_error",
    "load_tree",
    "parse_size",
    "parse_sizes",
    "target_bytes",
    "wide_console",
]


def parse_size(text: str) -> int:
    """Bytes from ``"256KiB"``, ``"4MB"``, ``"1048576"``; typer.BadParameter otherwise."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        return int(TypeAdapter(ByteSize).validate_python(text.strip()))
    except ValidationError:
        raise typer.BadParameter(f"not a size: {text!r} (e.g. 256KiB, 4MiB, 1000000)") from None


def parse_sizes(text: str) -> list[int]:
    """Bytes of each size in a comma-separated list (empty items skipped)."""
    return [parse_size(t) for t in text.split(",") if t.strip()]


def exit_topology_error(err: Exception, param_hint: str | None = None) -> NoReturn:
    """Print ``error: [param_hint: ]message`` on stderr as ONE line (a multi-line
    TopologyError joined with ``; ``) and exit with code 2 (a usage error), no
    traceback. Raises typer.Exit(2)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    prefix = f"{param_hint}: " if param_hint else ""
    typer.echo(f"error: {prefix}{'; '.join(lines) or type(err).__name__}", err=True)
    raise typer.Exit(2)


def load_tree(
    path: Path, executors: int | None, param_hint: str | None = None
) -> tuple[TopologyConfig, Tree]:
    """The topology at ``path`` and its tree for ``executors`` (needed for a branching
    topology). A TopologyError (the message names the file and the field) is printed as
    one line naming ``param_hint`` and exits with code 2 (:func:`exit_topology_error`)."""
    from dstltree.topology.config import TopologyError, load_topology

    try:
        topo = load_topology(path)
        return topo, topo.tree(executors)
    except TopologyError as e:
        exit_topology_error(e, param_hint)


def target_bytes(text: str | None, topo: TopologyConfig) -> int:
    """Target object size in bytes: ``text`` parsed if given, else the topology's."""
    return parse_size(text) if text else int(topo.target_object_bytes)


def wide_console(width: int) -> Console:
    """A stdout console; ``width`` columns when stdout is not a terminal (no wrapping
    of wide tables in pipes and files)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=width)
    return console


def echo_json(doc: Any) -> None:
    """``doc`` as indented JSON on stdout."""
    typer.echo(json.dumps(doc, indent=2))


def check_topology(path: Path) -> None:
    """Load the topology file at ``path`` once before anything starts, so that a
    malformed one ends in one error line naming the field (exit 2), not in a traceback
    from inside Spark. Raises typer.Exit(2)."""
    from dstltree.topology.config import TopologyError, load_topology

    try:
        load_topology(path)
    except TopologyError as e:
        exit_topology_error(e, "--topology")


TOPOLOGY_HELP = (
    "Topology: a YAML file, or the short name of a shipped one "
    "(local, s3, bench, cluster, cluster-hosts)."
)


def topology_file(value: Path | None) -> Path | None:
    """A typer callback: a topology option's value (a file or a shipped topology's short
    name, :func:`dstltree.topology.catalog.topology_path`) as the file it names. Raises
    typer.BadParameter naming the shipped names when it names none."""
    if value is None:
        return None
    from dstltree.topology.catalog import topology_path
    from dstltree.topology.tree import TopologyError

    try:
        return topology_path(value)
    except TopologyError as e:
        raise typer.BadParameter(str(e)) from None
