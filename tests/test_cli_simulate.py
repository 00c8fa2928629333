"""``dstl simulate`` and ``dstl plan`` through typer's CliRunner (small runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from sparkplug.commands import plan, simulate

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


@pytest.fixture()
def app() -> typer.Typer:
    a = typer.Typer()
    simulate.register(a)
    plan.register(a)
    return a


runner = CliRunner()


def flat(text: str) -> str:
    """The output with rich's error-panel borders and line wrapping removed."""
    return " ".join(text.replace("│", " ").split())


def test_simulate_json(app: typer.Typer) -> None:
    r = runner.invoke(
        app,
        [
            "simulate",
            "--executors",
            "7",
            "--tasks-per-executor",
            "4",
            "--bytes-per-checkpoint",
            "256KiB",
            "--checkpoints",
            "5",
            "--hedge-timeout",
            "off",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["design"] == "tree"
    assert set(out["checkpoint_ms"]) == {"p50", "p90", "p99", "p999"}
    for k in (
        "requests_per_checkpoint",
        "mean_object_bytes",
        "relay_fraction",
        "throttled_requests",
        "hedged_requests",
        "wall_s",
    ):
        assert k in out
    assert out["hedged_requests"] == 0


def test_simulate_several_designs_keyed_by_name(app: typer.Typer) -> None:
    r = runner.invoke(
        app,
        [
            "simulate",
            "--design",
            "task,executor",
            "--checkpoints",
            "3",
            "--json",
            "--dfs-latency",
            "local",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert set(out) == {"task", "executor"}
    assert out["task"]["requests_per_checkpoint"] == 28


def test_sweep_with_plot(app: typer.Typer, tmp_path: Path) -> None:
    png = tmp_path / "s.png"
    r = runner.invoke(
        app,
        [
            "simulate",
            "--executors",
            "15",
            "--checkpoints",
            "3",
            "--sweep-branching",
            "2,4",
            "--sweep-target",
            "1MiB,4MiB",
            "--design",
            "executor,tree",
            "--plot",
            str(png),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert len(out["results"]) == 1 + 4
    assert out["best"] is not None
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_table_and_topology(app: typer.Typer) -> None:
    r = runner.invoke(
        app,
        [
            "simulate",
            "--topology",
            str(DEPLOY / "local.yaml"),
            "--checkpoints",
            "3",
            "--design",
            "all",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "tree-noplan" in r.output and "p99" in r.output


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--dfs-latency", "nope"], "known"),
        (["--hedge-timeout", "soon"], "off"),
        (["--bytes-per-checkpoint", "lots"], "not a size"),
        (["--design", "flat"], "unknown"),
        (["--sweep-branching", "0"], ">= 1"),
    ],
)
def test_simulate_bad_flags(app: typer.Typer, args: list[str], msg: str) -> None:
    r = runner.invoke(app, ["simulate", "--checkpoints", "1", *args])
    assert r.exit_code == 2
    assert msg in flat(r.output)


def test_plan_table_and_json(app: typer.Typer) -> None:
    r = runner.invoke(
        app,
        [
            "plan",
            str(DEPLOY / "local.yaml"),
            "--bytes-per-executor",
            "1MiB",
            "--target-object-bytes",
            "2MiB",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "writer nodes" in r.output and "routes" in r.output
    r = runner.invoke(
        app,
        [
            "plan",
            str(DEPLOY / "cluster.yaml"),
            "--executors",
            "100",
            "--bytes-per-executor",
            "1MiB",
            "--skew",
            "0.1:10",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["nodes"] == 100 and out["total_bytes"] == (90 + 100) * 2**20
    assert all(w in out["routes"] for w in out["writers"])
    assert out["routes"]["e0"] == "e0"


def test_plan_down_node(app: typer.Typer) -> None:
    r = runner.invoke(
        app,
        [
            "plan",
            str(DEPLOY / "local.yaml"),
            "--bytes-per-executor",
            "3MiB",
            "--down",
            "a",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert "a" not in out["routes"]
    assert out["routes"]["a1"] == "root" and out["routes"]["b1"] == "b"


def test_plan_errors(app: typer.Typer) -> None:
    r = runner.invoke(app, ["plan", str(DEPLOY / "cluster.yaml"), "--bytes-per-executor", "1MiB"])
    assert r.exit_code == 2 and "executor count" in flat(r.output)
    r = runner.invoke(
        app, ["plan", str(DEPLOY / "local.yaml"), "--bytes-per-executor", "1MiB", "--skew", "x"]
    )
    assert r.exit_code == 2 and "FRACTION:FACTOR" in flat(r.output)
