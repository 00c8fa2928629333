"""Printing bench results: a rich table with the designs side by side, or JSON."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["print_table", "to_json"]

_ROWS: tuple[tuple[str, str, str], ...] = (
    ("objects_per_checkpoint", "objects / checkpoint", "{:.2f}"),
    ("objects_per_checkpoint_after_first_window", "  after 1st window", "{:.2f}"),
    ("requests_per_checkpoint", "DFS requests / checkpoint", "{:.2f}"),
    ("hedged_attempts_per_checkpoint", "  of which hedged", "{:.2f}"),
    ("mean_object_bytes", "mean object (KiB)", "kib"),
    ("persist_ms_p50", "persist p50 (ms)", "{:.1f}"),
    ("persist_ms_p99", "persist p99 (ms)", "{:.1f}"),
    ("persist_ms_p999", "persist p99.9 (ms)", "{:.1f}"),
    ("relay_fraction", "relay fraction", "pct"),
    ("relay_fraction_after_first_window", "  after 1st window", "pct"),
    ("throughput_mb_s", "throughput (MB/s)", "{:.1f}"),
    ("cpu_s_per_gb", "CPU s / GB", "{:.1f}"),
    ("writer_nodes_last_window", "writer nodes, last window", "list"),
)


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "list":
        return ",".join(value) if value else "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if fmt == "kib":
        return f"{value / 1024:.0f}"
    if fmt == "pct":
        return f"{value * 100:.1f} %"
    return fmt.format(value)


def print_table(results: dict[str, dict[str, Any]], title: str, console: Console) -> None:
    """One column per design, one row per metric."""
    table = Table(title=title)
    table.add_column("metric")
    for design in results:
        table.add_column(design, justify="right")
    for key, label, fmt in _ROWS:
        table.add_row(label, *(_fmt(results[d].get(key), fmt) for d in results))
    console.print(table)


def to_json(results: dict[str, Any], indent: int = 2) -> str:
    """The results as JSON (NaN written as null), indented by ``indent``."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(results), indent=indent)
