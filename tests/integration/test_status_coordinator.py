"""``dstl status --coordinator URL`` against a real CoordinatorMetrics served on a free
loopback port, with observations made here: the job's panel (checkpoints completed and
aborted, in flight, interval achieved and duration p50 / p99, completion requests and
metadata bytes per checkpoint) read at 80 columns, alone or below the nodes' table."""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from rich.console import Console
from typer.testing import CliRunner

from dstltree.cli.commands import status as status_command
from dstltree.cli.commands._status_job import job_rows, job_table
from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.metrics import CoordinatorMetrics
from tests.support.tree_fixtures import THREE_NODES

runner = CliRunner()


@pytest.fixture
def served() -> Iterator[CoordinatorMetrics]:
    m = CoordinatorMetrics(0)
    assert m.url is not None
    yield m
    m.close()


def observe_job(m: CoordinatorMetrics) -> None:
    """Ten triggers 0.3 s apart (the first without an interval), three in flight at the
    last; eight checkpoints completed of 20 ms, one aborted; completion paths of 1
    request but one of 3 (a conflict on the commit point); metadata of 2 KiB."""
    m.checkpoint_triggered(None, 1)
    for k in range(9):
        m.checkpoint_triggered(0.3, 1 + k % 3)
    for cp in range(1, 9):
        m.checkpoint_completed(CompletedCheckpoint(cp, 0, 0, time.time(), 0.02), 0.02)
        m.checkpoint_committed(3 if cp == 4 else 1, 2048)
    m.checkpoints_aborted.inc()


def render(table: object, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def line(text: str, figure: str) -> str:
    """The panel's line of ``figure`` with rich's borders and padding squeezed."""
    for row in text.splitlines():
        cells = " ".join(row.replace("│", " ").split())
        if cells.startswith(figure):
            return cells
    raise AssertionError(f"no line {figure!r} in:\n{text}")


def test_the_panel_gives_the_checkpoint_figures_at_80_columns(
    served: CoordinatorMetrics,
) -> None:
    assert served.url is not None
    observe_job(served)
    text = render(job_table(served.url, 2.0))
    assert max(len(r) for r in text.splitlines()) <= 80, text
    assert f"coordinator {served.url}" in text
    assert line(text, "checkpoints completed / aborted") == "checkpoints completed / aborted 8 / 1"
    assert line(text, "checkpoints in flight") == "checkpoints in flight 3"
    # all 9 intervals in the bucket (0.25, 0.3]: interpolated as Prometheus does
    assert line(text, "interval achieved") == "interval achieved p50 / p99 275.0 / 299.5 ms"
    # all 8 durations in (0.01, 0.025]
    assert line(text, "duration") == "duration p50 / p99 17.5 / 24.9 ms"
    # no tasks: phases of 0 s, in the first bucket (0, 0.01]
    assert line(text, "sync / async phase p99") == "sync / async phase p99 9.9 / 9.9 ms"
    assert line(text, "completion requests") == "completion requests / checkpoint 1.25 mean"
    assert line(text, "metadata / checkpoint") == "metadata / checkpoint 2.0 KiB mean"
    assert line(text, "materializations") == "materializations 0"
    assert line(text, "materialization p99") == "materialization p99 -"


def test_a_coordinator_without_checkpoints_yet_shows_dashes(served: CoordinatorMetrics) -> None:
    assert served.url is not None
    rows = dict(job_rows(status_command.scrape(served.url)))
    assert rows["checkpoints completed / aborted"] == "0 / 0"
    assert rows["checkpoints in flight"] == "0"
    for figure in (
        "interval achieved p50 / p99",
        "duration p50 / p99",
        "completion requests / checkpoint",
        "metadata / checkpoint",
    ):
        assert rows[figure] == "-", figure
    # an older coordinator without the in-flight gauge: not known rather than 0
    assert dict(job_rows({}))["checkpoints in flight"] == "-"


def status_app() -> typer.Typer:
    app = typer.Typer()
    status_command.register(app)
    app.command("noop", hidden=True)(lambda: None)  # keep "status" a sub-command
    return app


def test_status_shows_the_coordinator_alone_or_below_the_nodes(
    served: CoordinatorMetrics, tmp_path: Path
) -> None:
    assert served.url is not None
    observe_job(served)
    env = {"COLUMNS": "80"}
    res = runner.invoke(status_app(), ["status", "--coordinator", served.url, "--once"], env=env)
    assert res.exit_code == 0, res.output
    assert max(len(r) for r in res.output.splitlines()) <= 80, res.output
    assert "nodes up" not in res.output and " at " in res.output  # the time in its title
    assert line(res.output, "checkpoints completed") == "checkpoints completed / aborted 8 / 1"
    assert line(res.output, "interval achieved") == "interval achieved p50 / p99 275.0 / 299.5 ms"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there: the nodes are down
    topo_file = tmp_path / "topo.yaml"
    topo_file.write_text(yaml.safe_dump({"nodes": THREE_NODES, "metrics_port": port}))
    args = ["status", "--topology", str(topo_file), "--coordinator", served.url, "--once"]
    res = runner.invoke(status_app(), [*args, "--timeout", "0.5"], env=env)
    assert res.exit_code == 0, res.output
    assert max(len(r) for r in res.output.splitlines()) <= 80, res.output
    assert "0/3 nodes up" in res.output
    assert res.output.index("nodes up") < res.output.index("checkpoints completed")
    assert line(res.output, "completion requests") == "completion requests / checkpoint 1.25 mean"


def test_status_needs_a_topology_or_a_coordinator() -> None:
    res = runner.invoke(status_app(), ["status", "--once"])
    assert res.exit_code == 2 and "--coordinator" in res.output
