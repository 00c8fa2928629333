"""``dstl simulate`` and ``dstl plan`` through typer's CliRunner (small runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dstltree.cli.commands import plan, simulate
from dstltree.topology.designs import DESIGNS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


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
    assert out["design"] == "tree" and out["executors"] == 7 and out["checkpoints"] == 5
    ms = out["checkpoint_ms"]
    assert list(ms) == ["p50", "p90", "p99", "p999"]
    assert 0 < ms["p50"] <= ms["p90"] <= ms["p99"] <= ms["p999"]
    # hedging off and 2 PUT/s far below the limit: one request per object
    assert out["hedged_requests"] == 0 and out["throttled_requests"] == 0
    assert out["requests_per_checkpoint"] == out["objects_per_checkpoint"]
    # every checkpoint's 7 x 4 x 256 KiB land in objects of the default 4 MiB target
    total = 7 * 4 * 256 * 1024
    assert out["objects_per_checkpoint"] * out["mean_object_bytes"] == total
    assert out["objects_per_checkpoint"] >= math.ceil(total / (4 * 2**20))


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
    assert out["task"]["requests_per_checkpoint"] == 28  # 7 executors x 4 tasks
    assert out["task"]["mean_object_bytes"] == 256 * 1024
    assert out["executor"]["requests_per_checkpoint"] == 7
    assert out["executor"]["mean_object_bytes"] == 4 * 256 * 1024
    assert out["task"]["relay_fraction"] == out["executor"]["relay_fraction"] == 0


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
    runs = {(r["design"], r["branching"], r["target_object_bytes"]) for r in out["results"]}
    assert len(out["results"]) == 1 + 4
    trees = {(b, t) for d, b, t in runs if d == "tree"}
    assert trees == {(b, t * 2**20) for b in (2, 4) for t in (1, 4)}
    assert [d for d, _b, _t in runs].count("executor") == 1  # flat: not swept
    ok = [r for r in out["results"] if r["throttled_requests"] == 0]
    low = min(r["checkpoint_ms"]["p99"] for r in ok)  # best: fewest requests near it
    near = [r for r in ok if r["checkpoint_ms"]["p99"] <= low * 1.05]
    assert out["best"]["requests_per_checkpoint"] == min(r["requests_per_checkpoint"] for r in near)
    assert out["best"]["checkpoint_ms"]["p99"] <= low * 1.05
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    rows = [line.split("│")[1].strip() for line in r.output.splitlines() if "│" in line]
    assert rows == list(DESIGNS)  # one row per design, in order


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
    assert "of 7 live nodes, target 2.00 MiB" in r.output
    assert "total 7.00 MiB per checkpoint" in r.output
    routes = r.output.split("routes", 1)[1]
    assert [line.split("│")[1].strip() for line in routes.splitlines() if "│" in line] == [
        "root",
        "a",
        "b",
        "a1",
        "a2",
        "b1",
        "b2",
    ]
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
    assert all(out["routes"][w] == w for w in out["writers"])  # a collector routes to itself
    assert sum(w["nodes"] for w in out["writers"].values()) == 100
    assert sum(w["expected_bytes"] for w in out["writers"].values()) == out["total_bytes"]
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
    # deploy/local.yaml is a DAG: a1's second parent b takes it while a is down
    assert out["routes"]["a1"] == "b" and out["routes"]["b1"] == "b"


def test_plan_errors(app: typer.Typer) -> None:
    r = runner.invoke(app, ["plan", str(DEPLOY / "cluster.yaml"), "--bytes-per-executor", "1MiB"])
    assert r.exit_code == 2 and "executor count" in flat(r.output)
    r = runner.invoke(
        app, ["plan", str(DEPLOY / "local.yaml"), "--bytes-per-executor", "1MiB", "--skew", "x"]
    )
    assert r.exit_code == 2 and "FRACTION:FACTOR" in flat(r.output)


def test_emit_topology_loads(app: typer.Typer, tmp_path: Path) -> None:
    """``--emit-topology`` writes the best tree setting of a sweep as a topology file
    that ``load_topology`` reads back (branching and target of the best run)."""
    from dstltree.topology.config import load_topology

    out = tmp_path / "recommended.yaml"
    r = runner.invoke(
        app,
        [
            "simulate",
            "--executors",
            "30",
            "--checkpoints",
            "4",
            "--sweep-branching",
            "2,4",
            "--sweep-target",
            "1MiB,4MiB",
            "--design",
            "tree",
            "--json",
            "--emit-topology",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    best = json.loads(r.output)["best"]
    topo = load_topology(out)
    assert topo.branching == best["branching"]
    assert int(topo.target_object_bytes) == best["target_object_bytes"]
    assert topo.plan_window == 4 and topo.upload_attempts == 3
    assert len(topo.tree(30)) == 30
    assert out.read_text().startswith("# Recommended by dstl simulate: 30 executors")


def test_emit_topology_needs_a_tree_run(app: typer.Typer, tmp_path: Path) -> None:
    r = runner.invoke(
        app,
        [
            "simulate",
            "--design",
            "task",
            "--checkpoints",
            "2",
            "--emit-topology",
            str(tmp_path / "t.yaml"),
        ],
    )
    assert r.exit_code != 0 and "no tree setting" in flat(r.output)


def test_simulate_coordinator_flag(app: typer.Typer) -> None:
    """--coordinator: the coordinator core triggers and completes the checkpoints, so a
    checkpoint's latency includes the acks and the metadata write after the last
    writer's ack; the default keeps the fixed trigger."""
    args = ["simulate", "--checkpoints", "3", "--dfs-latency", "local", "--json"]
    fixed = runner.invoke(app, args)
    assert fixed.exit_code == 0, fixed.output
    off = json.loads(fixed.output)
    assert off["coordinator"] is False and off["coordinator_ms"] == {}
    assert off["checkpoint_ms"] == off["writers_ms"]
    r = runner.invoke(app, [*args, "--coordinator"])
    assert r.exit_code == 0, r.output
    on = json.loads(r.output)
    assert on["coordinator"] is True
    assert on["checkpoint_ms"]["p50"] > on["writers_ms"]["p50"] and on["coordinator_ms"]["p50"] > 0


def test_simulate_node_failures_compares_a_tree_and_a_dag(app: typer.Typer) -> None:
    args = ["simulate", "--checkpoints", "60", "--node-failures-per-hour", "600", "--seed", "3"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["tree"]
    cases = {(row["layout"], row["case"]): row for row in rows}
    assert set(cases) == {(lay, c) for lay in ("tree", "dag") for c in ("without", "with")}
    assert cases["tree", "with"]["node_deaths"] == cases["dag", "with"]["node_deaths"] > 0
    assert cases["tree", "without"]["node_deaths"] == 0
    assert cases["tree", "with"]["fallback_segments"] > 0 == cases["tree", "with"]["failovers"]
    assert cases["dag", "with"]["failovers"] > 0
    for row in rows:
        assert row["p99_vs_without"] == pytest.approx(
            row["p99"] / cases[row["layout"], "without"]["p99"], rel=1e-2
        )
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "p99 vs none" in table.output and "600 per node-hour" in flat(table.output)


def test_simulate_node_failures_need_a_tree_design(app: typer.Typer) -> None:
    r = runner.invoke(app, ["simulate", "--node-failures-per-hour", "1", "--design", "task"])
    assert r.exit_code == 2 and "need a tree design" in flat(r.output)
    r = runner.invoke(app, ["simulate", "--node-failures-per-hour", "-1"])
    assert r.exit_code == 2
