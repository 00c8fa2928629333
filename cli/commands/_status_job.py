"""``dstl status --coordinator URL``: the job's checkpoints and materializations from the
coordinator's Prometheus metrics (coordinator/metrics.py), beside the nodes' table."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["job_rows", "job_table"]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _p99_ms(s: Samples, histogram: str) -> str:
    from dstltree.cli.commands.status import p99_from_buckets

    buckets = [(float(lab["le"]), v) for lab, v in s.get(f"{histogram}_bucket", []) if "le" in lab]
    p99 = p99_from_buckets(buckets)
    return "-" if p99 is None else f"{1000 * p99:.1f} ms"


def _total(s: Samples, name: str) -> float:
    return sum(v for _, v in s.get(name, []))


def job_rows(s: Samples) -> list[tuple[str, str]]:
    """(figure, value) rows of one scrape of the coordinator's metrics: checkpoints and
    their duration, synchronous and asynchronous phase p99 (bucket interpolation),
    materializations, their duration p99, and the snapshot bytes written and reused
    (referenced again from earlier materializations) over all epochs."""
    size = _total(s, "dstl_materialization_size_bytes_sum")
    written = _total(s, "dstl_materialization_written_bytes_sum")
    return [
        ("checkpoints completed", f"{_total(s, 'dstl_checkpoints_completed_total'):.0f}"),
        ("checkpoints aborted", f"{_total(s, 'dstl_checkpoints_aborted_total'):.0f}"),
        ("checkpoint duration p99", _p99_ms(s, "dstl_checkpoint_duration_seconds")),
        ("  synchronous phase p99", _p99_ms(s, "dstl_checkpoint_sync_seconds")),
        ("  asynchronous phase p99", _p99_ms(s, "dstl_checkpoint_async_seconds")),
        ("materializations", f"{_total(s, 'dstl_materializations_completed_total'):.0f}"),
        ("materialization p99", _p99_ms(s, "dstl_materialization_duration_seconds")),
        (
            "materialized bytes written / reused",
            f"{written:,.0f} / {max(0.0, size - written):,.0f}",
        ),
    ]


def job_table(url: str, timeout: float) -> Table:
    """The job's table; a coordinator that does not answer is said so in the title."""
    from rich.table import Table

    from dstltree.cli.commands.status import scrape

    try:
        rows = job_rows(scrape(url, timeout))
        title = f"job (coordinator {url})"
    except (OSError, ValueError) as e:
        rows, title = [], f"job: coordinator {url} not answering ({e})"
    t = Table(title=title)
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in rows:
        t.add_row(k, v)
    return t
