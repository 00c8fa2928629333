"""``dstl status --bridges``: this host's Structured Streaming bridges and the queries
they serve, asked over each bridge's socket (the protocol's ``status`` request).

The bridges come from ``--bridge SOCKET`` (repeatable) or, without it, from the
registry every running ``dstl bridge`` (and every bridge ``configure()`` starts) writes
(structured_streaming/registry.py). A bridge that does not answer is shown as down.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Group

__all__ = ["bridge_statuses", "bridges_view"]


def bridge_statuses(sockets: list[Path], timeout: float) -> list[dict[str, Any]]:
    """One object per bridge: ``socket``, ``up`` and, when up, the bridge's ``status``
    reply (``bridge``, ``pid``, ``counts``, ``bytes``, ``queries``); ``error`` when down.
    ``sockets`` empty: the registered bridges of this host."""
    from dstltree.structured_streaming.client import BridgeReader, BridgeRequestError
    from dstltree.structured_streaming.registry import registered

    targets = [str(s) for s in sockets] or [e["socket"] for e in registered()]
    metrics = {e["socket"]: e.get("metrics") for e in registered()} if not sockets else {}
    out: list[dict[str, Any]] = []
    for sock in targets:
        row: dict[str, Any] = {"socket": sock, "metrics": metrics.get(sock)}
        try:
            with BridgeReader(sock, timeout=timeout) as reader:
                row.update(reader.status(), up=True)
        except (OSError, BridgeRequestError, ValueError) as e:
            row.update(up=False, error=f"{type(e).__name__}: {e}")
        out.append(row)
    return out


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _age(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f} s ago"


def _query_cells(q: dict[str, Any]) -> list[str]:
    per, batch = q["objects_per_batch"], q["last_batch"]
    return [
        "-" if batch is None else str(batch),
        str(q["commits"]),
        _age(q["last_commit_age"]),
        "-" if per is None else f"{per:.2f}",
        str(q["files_durable"]),
        _size(q["held_bytes"]),
        str(q["plain_files"]),
    ]


def bridges_view(rows: list[dict[str, Any]], when: str = "") -> Group:
    """Two tables: the bridges (socket, id, pid, queries, held and in-flight bytes,
    writes accepted, durable and failed) and their queries (root, last batch, commits,
    last commit, objects per batch, durable files, held bytes, plain-file fallbacks)."""
    from rich.console import Group
    from rich.table import Table

    bridges = Table(title=f"Structured Streaming bridges{when}", title_justify="left")
    for col in (
        "socket",
        "bridge",
        "pid",
        "queries",
        "held",
        "in flight",
        "accepted/durable",
        "failed",
    ):
        bridges.add_column(col, justify="left" if col in ("socket", "bridge") else "right")
    queries = Table(title="queries", title_justify="left")
    cols = ("root", "bridge", "last batch", "commits", "last commit", "objects/batch")
    for col in (*cols, "files", "held", "plain files"):
        queries.add_column(col, justify="left" if col in ("root", "bridge") else "right")
    for r in rows:
        if not r["up"]:
            bridges.add_row(r["socket"], "[red]down[/red]", "-", "-", "-", "-", "-", "-")
            continue
        b, c = r["bytes"], r["counts"]
        durable = f"{c['puts']} / {c['durable']}"
        held, flight = _size(b["held"]), _size(b["in_flight"])
        ident = r["bridge"] or "-"
        n = str(len(r["queries"]))
        bridges.add_row(
            r["socket"], ident, str(r["pid"]), n, held, flight, durable, str(c["failed"])
        )
        for q in r["queries"]:
            queries.add_row(q["root"], ident, *_query_cells(q))
    if not rows:
        bridges.caption = "no bridge registered on this host (give --bridge SOCKET)"
    return Group(bridges, queries)
