"""``dstl bench``: a small run of all four designs over the 7-node tree of
deploy/bench.yaml, checking what the workload fixes (segments, bytes, objects of the
flat designs, requests) and the tree's bounds; performance is measured, never
asserted. And the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstltree.bench import DESIGNS
from dstltree.bench.designs import BenchSettings
from dstltree.bench.metrics import JSON_FIELDS, segments_of
from dstltree.bench.run import BenchResult, run_bench
from dstltree.bench.storage import BenchStorage
from dstltree.bench.workload import Workload, parse_distribution
from dstltree.cli.app import app
from dstltree.topology.config import load_topology

TOPOLOGY = Path(__file__).resolve().parents[2] / "deploy" / "bench.yaml"
WRITERS = 14
EXECUTORS = 7
TARGET = 256 * 1024  # > a subtree (3 x 64 KiB): with plans the leaves send straight to the root
WINDOW = 2
BYTES = 32 * 1024  # per writer per checkpoint (constant distribution)
CHECKPOINTS = 4
SEGMENT_OVERHEAD = 1024  # bound on a segment's header and index bytes beyond its changes


@pytest.fixture(scope="module")
def result() -> BenchResult:
    topo = load_topology(TOPOLOGY)
    settings = BenchSettings(
        workload=Workload(WRITERS, EXECUTORS, BYTES, checkpoints=CHECKPOINTS, seed=1),
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
        assert m["checkpoints"] == CHECKPOINTS


@pytest.mark.parametrize("design", DESIGNS)
def test_every_writer_persists_one_segment_per_checkpoint(result: BenchResult, design: str) -> None:
    """Each writer appends BYTES per checkpoint (far below the pre-emptive upload size),
    so each checkpoint holds one new segment per writer with those bytes plus a bounded
    encoding overhead."""
    segs = segments_of(result.runs[design])
    assert len(segs) == WRITERS * CHECKPOINTS
    for k in range(CHECKPOINTS):
        assert sum(1 for s in segs if s.k == k) == WRITERS
    assert all(BYTES < s.length <= BYTES + SEGMENT_OVERHEAD for s in segs)
    assert result.metrics[design]["segment_bytes"] == sum(s.length for s in segs)


def test_task_writes_one_object_per_writer(result: BenchResult) -> None:
    m = result.metrics["task"]
    assert m["objects_per_checkpoint"] == WRITERS
    assert m["objects"] == WRITERS * CHECKPOINTS
    # local filesystem: one PUT per object, plus any attempt hedging started
    assert m["requests_per_checkpoint"] == WRITERS + m["hedged_attempts_per_checkpoint"]
    assert m["relay_fraction"] == 0.0 and m["writer_nodes_last_window"] == []


def test_executor_writes_one_object_per_executor(result: BenchResult) -> None:
    m = result.metrics["executor"]
    assert m["objects_per_checkpoint"] == EXECUTORS
    assert m["objects"] == EXECUTORS * CHECKPOINTS
    assert m["mean_object_bytes"] == m["segment_bytes"] / (EXECUTORS * CHECKPOINTS)


def test_tree_objects_bounded_by_target_plus_writer_nodes(result: BenchResult) -> None:
    run = result.runs["tree"]
    per_cp: dict[int, list] = {}
    for s in segments_of(run):
        per_cp.setdefault(s.k, []).append(s)
    assert sorted(per_cp) == list(range(CHECKPOINTS))
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
    # hop by hop, an inner node (at most 3 x 64 KiB < TARGET) forwards everything to the
    # root: exactly the segments of the 4 leaves' 8 writers are relayed (by a and b)
    leaf_writers = 4 * WRITERS // EXECUTORS
    assert noplan["relay_fraction"] == leaf_writers / WRITERS
    assert noplan["relay_fraction_after_first_window"] == leaf_writers / WRITERS


def test_distribution_parsing() -> None:
    assert parse_distribution("lognormal:0.8").sigma == 0.8
    skew = parse_distribution("skewed:0.25:4")
    wl = Workload(8, 4, 1000, 2, skew, seed=3)
    assert wl.hot_executors() == {0}
    sizes = wl.sizes()
    assert sizes[0][0] == [4000, 4000] and sizes[0][1] == [1000, 1000]
    with pytest.raises(ValueError):
        parse_distribution("zipf")


def test_lognormal_sizes_follow_the_seed_and_the_mean() -> None:
    """Sizes are drawn per writer and checkpoint, fixed by the seed, with mean B: over
    400 x 5 draws of sigma 0.5 the sample mean's standard error is about 1.2 % of B."""
    logn = parse_distribution("lognormal")
    wl = Workload(400, 4, 1000, 5, logn, seed=3)
    sizes = wl.sizes()
    assert [len(per_exec) for per_exec in sizes] == [4] * 5
    assert all(len(sizes[k][e]) == 100 for k in range(5) for e in range(4))
    assert sizes == Workload(400, 4, 1000, 5, logn, seed=3).sizes()
    assert sizes != Workload(400, 4, 1000, 5, logn, seed=4).sizes()
    flat = [b for per_exec in sizes for row in per_exec for b in row]
    assert len(set(flat)) > len(flat) // 2  # drawn, not constant
    assert min(flat) >= 1
    assert abs(sum(flat) / len(flat) - 1000) < 60  # 5 standard errors


def test_cli_json_and_bad_flags() -> None:
    runner = CliRunner()
    out = runner.invoke(
        app,
        [
            "bench",
            "--topology",
            str(TOPOLOGY),
            "--designs",
            "task,executor",
            "--writers",
            "7",
            "--bytes-per-checkpoint",
            "16KiB",
            "--checkpoints",
            "2",
            "--checkpoint-interval",
            "0",
            "--dfs-faults",
            "flip158-s3,scale=0.001",
            "--hedge-timeout",
            "off",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert set(doc) == {"task", "executor"}
    for design in doc.values():
        assert set(JSON_FIELDS) <= set(design)
    assert doc["task"]["objects_per_checkpoint"] == 7  # 7 writers, one per executor
    assert doc["executor"]["objects_per_checkpoint"] == 7
    for design in doc.values():
        assert design["checkpoints"] == 2
        assert design["hedged_attempts_per_checkpoint"] == 0  # hedging off
        payload = 7 * 2 * 16 * 1024
        assert payload < design["segment_bytes"] <= payload + 7 * 2 * SEGMENT_OVERHEAD


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--designs", "spark"], "unknown designs ['spark']"),
        (["--hedge-timeout", "soon"], "seconds or 'off', got 'soon'"),
        (["--hedge-timeout", "0"], "must be > 0 seconds"),
        (["--writers", "3"], "need at least one writer per executor (7)"),
        (["--executors", "9"], "9 executors but the tree has 7 nodes"),
        (["--storage-options", "[1"], "not JSON"),
        (["--distribution", "zipf"], "expected constant, lognormal"),
    ],
)
def test_cli_bad_flags(args: list[str], msg: str) -> None:
    bad = CliRunner().invoke(app, ["bench", "--topology", str(TOPOLOGY), *args])
    assert bad.exit_code == 2
    assert msg in " ".join(bad.output.replace("│", " ").split())
