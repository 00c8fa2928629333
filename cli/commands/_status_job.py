"""``dstl status --coordinator URL``: the job's checkpoints and materializations from the
coordinator's Prometheus metrics (coordinator/metrics.py), beside the nodes' table or
alone. A compact panel of two columns that reads at 80 columns."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["job_rows", "job_table"]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _quantile_s(s: Samples, histogram: str, q: float) -> float | None:
    from dstltree.cli.commands.status import p99_from_buckets

    buckets = [(float(lab["le"]), v) for lab, v in s.get(f"{histogram}_bucket", []) if "le" in lab]
    return p99_from_buckets(buckets, q)


def _ms(*values: float | None) -> str:
    """``a / b ms``; ``-`` for a value not known (no observations)."""
    text = " / ".join("-" if v is None else f"{1000 * v:.1f}" for v in values)
    return "-" if all(v is None for v in values) else f"{text} ms"


def _p50_p99_ms(s: Samples, histogram: str) -> str:
    return _ms(_quantile_s(s, histogram, 0.5), _quantile_s(s, histogram, 0.99))


def _total(s: Samples, name: str) -> float:
    return sum(v for _, v in s.get(name, []))


def _mean(s: Samples, histogram: str) -> float | None:
    """Sum over count of a histogram; None without observations."""
    count = _total(s, f"{histogram}_count")
    return _total(s, f"{histogram}_sum") / count if count > 0 else None


def _requests(s: Samples) -> str:
    mean = _mean(s, "dstl_checkpoint_completion_requests")
    return "-" if mean is None else f"{mean:.2f} mean"


def _metadata(s: Samples) -> str:
    from dstltree.cli.commands.status import _bytes

    mean = _mean(s, "dstl_checkpoint_metadata_bytes")
    return "-" if mean is None else f"{_bytes(mean)} mean"


def _inflight(s: Samples) -> str:
    """Mean and p99 of a checkpoint's in-flight bytes (``-`` without observations)."""
    from dstltree.cli.commands.status import _bytes

    mean = _mean(s, "dstl_checkpoint_inflight_bytes")
    p99 = _quantile_s(s, "dstl_checkpoint_inflight_bytes", 0.99)
    if mean is None or p99 is None:
        return "-"
    return f"{_bytes(mean)} mean / {_bytes(p99)} p99"


def _gauge(s: Samples, name: str) -> str:
    """A gauge's (or counter's) value, ``-`` when the coordinator does not export it
    (an older one)."""
    return f"{_total(s, name):.0f}" if name in s else "-"


def job_rows(s: Samples) -> list[tuple[str, str]]:
    """(figure, value) rows of one scrape of the coordinator's metrics: checkpoints
    completed and aborted, in flight (at the latest trigger), the interval achieved
    (trigger to trigger) and the duration p50 / p99, the longest synchronous and
    asynchronous phase p99 (quantiles interpolated in the histograms' buckets), the
    longest alignment and start delay p99 and the checkpoints taken unaligned
    (FLIP-76; ``-`` from a coordinator without these metrics), the in-flight bytes
    per checkpoint (mean and p99), the mean storage requests on a checkpoint's
    completion path and the mean metadata size; materializations, their duration
    p99, and the snapshot bytes written and reused (referenced again from earlier
    materializations) over all epochs."""
    size = _total(s, "dstl_materialization_size_bytes_sum")
    written = _total(s, "dstl_materialization_written_bytes_sum")
    completed = _total(s, "dstl_checkpoints_completed_total")
    aborted = _total(s, "dstl_checkpoints_aborted_total")
    phases = _ms(
        _quantile_s(s, "dstl_checkpoint_sync_seconds", 0.99),
        _quantile_s(s, "dstl_checkpoint_async_seconds", 0.99),
    )
    alignment = _ms(
        _quantile_s(s, "dstl_checkpoint_alignment_seconds", 0.99),
        _quantile_s(s, "dstl_checkpoint_start_delay_seconds", 0.99),
    )
    return [
        ("checkpoints completed / aborted", f"{completed:.0f} / {aborted:.0f}"),
        ("checkpoints in flight", _gauge(s, "dstl_checkpoints_in_flight")),
        ("interval achieved p50 / p99", _p50_p99_ms(s, "dstl_checkpoint_interval_seconds")),
        ("duration p50 / p99", _p50_p99_ms(s, "dstl_checkpoint_duration_seconds")),
        ("  sync / async phase p99", phases),
        ("  alignment / start delay p99", alignment),
        ("unaligned checkpoints", _gauge(s, "dstl_checkpoints_unaligned_total")),
        ("in-flight data / checkpoint", _inflight(s)),
        ("completion requests / checkpoint", _requests(s)),
        ("metadata / checkpoint", _metadata(s)),
        ("materializations", f"{_total(s, 'dstl_materializations_completed_total'):.0f}"),
        ("materialization p99", _ms(_quantile_s(s, "dstl_materialization_duration_seconds", 0.99))),
        (
            "materialized written / reused",
            f"{written:,.0f} / {max(0.0, size - written):,.0f} B",
        ),
    ]


def job_table(url: str, timeout: float, when: str = "") -> Table:
    """The job's table (``when`` ends its title), at least as wide as its title (as the
    console allows); a coordinator that does not answer is said so in the title."""
    from rich.table import Table

    from dstltree.cli.commands.status import scrape

    try:
        rows = job_rows(scrape(url, timeout))
        title = f"job (coordinator {url}){when}"
    except (OSError, ValueError) as e:
        rows, title = [], f"job: coordinator {url} not answering ({e}){when}"
    t = Table(title=title, min_width=len(title))  # the title on one line where it fits
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in rows:
        t.add_row(k, v)
    return t
