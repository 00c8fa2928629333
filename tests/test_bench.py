"""``dstl bench`` (issue 3): a small run of all four designs over the 7-node tree of
deploy/bench.yaml, checking structure only (performance is measured, never asserted),
and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparkplug.bench import DESIGNS
from sparkplug.bench.designs import BenchSettings
from sparkplug.bench.metrics import JSON_FIELDS, segments_of
from sparkplug.bench.run import BenchResult, run_bench
from sparkplug.bench.storage import BenchStorage
from sparkplug.bench.workload import Workload, parse_distribution
from sparkplug.cli import app
from topology.config import load_topology

TOPOLOGY = Path(__file__).resolve().parent.parent / "deploy" / "bench.yaml"
WRITERS = 14
EXECUTORS = 7
TARGET = 256 * 1024  # > a subtree (3 x 64 KiB): with plans the leaves send straight to the root
WINDOW = 2


@pytest.fixture(scope="module")
def result() -> BenchResult:
    topo = load_topology(TOPOLOGY)
    settings = BenchSettings(
        workload=Workload(WRITERS, EXECUTORS, 32 * 1024, checkpoints=4, seed=1),
        topology=topo.model_dump(mode="json", exclude={"nodes", "branching"}),
        tree=topo.tree(),
        target_object_bytes=TARGET,
        plan_window=WINDOW,
        checkpoint_interval=0.0,
        executor_persist_delay=2.0,  # flush on "all persisted" only, however slow the box
    )
    return run_bench(settings, DESIGNS, BenchStorage())


def test_all_designs_report_every_field(result: BenchResult) -> None:
    assert list(result.metrics) == list(DESIGNS)
    for m in result.metrics.values():
        for f in JSON_FIELDS:
            assert isinstance(m[f], float) and not math.isnan(m[f]), f
        assert m["checkpoints"] == 4


def test_task_writes_one_object_per_writer(result: BenchResult) -> None:
    assert result.metrics["task"]["objects_per_checkpoint"] == WRITERS
    assert result.metrics["task"]["requests_per_checkpoint"] >= WRITERS


def test_executor_writes_one_object_per_executor(result: BenchResult) -> None:
    assert result.metrics["executor"]["objects_per_checkpoint"] == EXECUTORS


def test_tree_objects_bounded_by_target_plus_writer_nodes(result: BenchResult) -> None:
    run = result.runs["tree"]
    per_cp: dict[int, list] = {}
    for s in segments_of(run):
        per_cp.setdefault(s.k, []).append(s)
    assert len(per_cp) == 4
    for k, segs in per_cp.items():
        nbytes = sum(s.length for s in segs)
        writer_nodes = {s.writer for s in segs}
        assert all(not w.startswith("x-") for w in writer_nodes)  # no fallback writes
        if k >= WINDOW:  # before the first plan arrives, delay flushes may split batches
            bound = math.ceil(nbytes / TARGET) + len(writer_nodes)
            assert len({s.path for s in segs}) <= bound
    acc = result.acceptance["tree"]
    assert acc["objects_ok"] and acc["mean_object_ok"]


def test_plans_keep_relaying_low_and_noplan_relays_more(result: BenchResult) -> None:
    tree, noplan = result.metrics["tree"], result.metrics["tree-noplan"]
    assert tree["relay_fraction_after_first_window"] <= 0.05
    assert result.acceptance["tree"]["relay_ok"]
    assert noplan["relay_fraction"] > tree["relay_fraction"]
    assert noplan["relay_fraction_after_first_window"] > 0.05


def test_distribution_parsing() -> None:
    assert parse_distribution("lognormal:0.8").sigma == 0.8
    skew = parse_distribution("skewed:0.25:4")
    wl = Workload(8, 4, 1000, 2, skew, seed=3)
    assert wl.hot_executors() == {0}
    sizes = wl.sizes()
    assert sizes[0][0] == [4000, 4000] and sizes[0][1] == [1000, 1000]
    logn = Workload(8, 4, 1000, 2, parse_distribution("lognormal"), seed=3)
    assert logn.sizes() == logn.sizes()  # seeded
    with pytest.raises(ValueError):
        parse_distribution("zipf")


def test_cli_json_and_bad_flags() -> None:
    runner = CliRunner()
    out = runner.invoke(
        app,
        ["bench", "--topology", str(TOPOLOGY), "--designs", "task,executor", "--writers", "7",
         "--bytes-per-checkpoint", "16KiB", "--checkpoints", "2", "--checkpoint-interval", "0",
         "--dfs-faults", "flip158-s3,scale=0.001", "--hedge-timeout", "off", "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert set(doc) == {"task", "executor"}
    for design in doc.values():
        assert set(JSON_FIELDS) <= set(design)
    assert doc["task"]["objects_per_checkpoint"] == 7
    bad = runner.invoke(app, ["bench", "--designs", "spark"])
    assert bad.exit_code != 0
    bad = runner.invoke(app, ["bench", "--hedge-timeout", "soon"])
    assert bad.exit_code != 0
