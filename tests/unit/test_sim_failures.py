"""Node failures in the simulator (simulations/failures.py): the seeded schedule, the
node cores' re-homing and the clients' failover on the real code, a DAG against a tree.
Small configurations; no timed assertions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dstltree.simulations import SimConfig, simulate
from dstltree.simulations.cluster import _Sim
from dstltree.simulations.failures import compare_layouts, failure_schedule

BASE = SimConfig(checkpoints=120, seed=4, bytes_per_checkpoint=64 * 1024)


def test_the_schedule_is_seeded_per_node_and_a_dead_node_does_not_die_again() -> None:
    cfg = replace(BASE, node_failures_per_hour=600.0, restart_s=2.0)
    deaths = failure_schedule(cfg, 3600.0)
    assert deaths == failure_schedule(cfg, 3600.0)
    assert deaths != failure_schedule(replace(cfg, seed=5), 3600.0)
    assert failure_schedule(replace(cfg, node_failures_per_hour=0.0), 3600.0) == []
    assert deaths == sorted(deaths) and min(t for t, _ in deaths) >= cfg.startup_s
    for v in range(cfg.executors):
        times = [t for t, u in deaths if u == v]
        assert all(b - a >= cfg.restart_s for a, b in zip(times, times[1:], strict=False))
        # 600 per hour, each death pausing the clock for 2 s: about 600 / 1.33 = 450
        assert 350 < len(times) < 560, len(times)
    # a longer horizon only adds deaths at the end: each node's stream is its own
    assert failure_schedule(cfg, 7200.0)[: len(deaths)] == deaths


def test_failures_that_never_come_change_nothing() -> None:
    """Failures on (ack deadlines, kept items) but none before the end: the same
    checkpoints as with failures off, for a tree and for a DAG."""
    for dag in (False, True):
        cfg = replace(BASE, second_parents=dag)
        calm = simulate(cfg)
        armed = simulate(replace(cfg, node_failures_per_hour=1e-6))
        assert armed.node_deaths == 0
        assert armed.each_checkpoint_ms == calm.each_checkpoint_ms
        assert armed.objects_each_checkpoint == calm.objects_each_checkpoint


def test_without_failures_a_dag_and_a_tree_agree_while_no_ack_times_out() -> None:
    cfg = replace(BASE, parent_timeout_s=100.0)
    tree = simulate(replace(cfg, second_parents=False))
    dag = simulate(replace(cfg, second_parents=True))
    assert tree.each_checkpoint_ms == dag.each_checkpoint_ms


def test_a_dead_node_s_children_re_home_to_their_second_parent_and_return() -> None:
    """e1 dies: once noticed, e5 and e6 (second parent e2) report to e2 and e1's
    writers send to e2 (the next executor's node); after the restart and the
    hold-down, all of them are back on e1."""
    cfg = replace(BASE, node_failures_per_hour=1e-9, check_invariants=True)
    sim = _Sim(cfg)
    nodes, failures = sim.nodes, sim.failures
    assert nodes is not None and failures is not None
    proc = sim.env.process(sim.checkpoints())
    e1 = nodes.index["e1"]
    sim.env.run(until=2.0)
    failures._kill(e1)
    sim.env.run(until=2.0 + cfg.failure_detection_s + 0.01)
    assert [nodes.hosts[nodes.index[c]].core.parent for c in ("e5", "e6")] == ["e2", "e2"]
    assert nodes.route[e1] == nodes.index["e2"] and failures.failovers == 1
    sim.env.run(until=2.0 + cfg.restart_s + cfg.hold_down_s + 1.0)
    assert [nodes.hosts[nodes.index[c]].core.parent for c in ("e5", "e6")] == ["e1", "e1"]
    assert nodes.route[e1] == e1 and failures.returns == 1
    sim.env.run(until=proc)
    assert nodes.fallbacks == 0 and not nodes.left  # every checkpoint acknowledged


def test_a_dag_loses_no_checkpoint_to_direct_writes_where_a_tree_waits_them_out() -> None:
    cfg = replace(BASE, node_failures_per_hour=300.0, check_invariants=True)
    runs = compare_layouts(cfg)
    tree, dag = runs["tree"]["with"], runs["dag"]["with"]
    assert tree.node_deaths == dag.node_deaths > 10  # the same schedule for both
    assert len(tree.each_checkpoint_ms) == len(dag.each_checkpoint_ms) == cfg.checkpoints
    assert tree.fallback_segments > 0 and tree.failovers == 0
    assert dag.fallback_segments == 0 and dag.failovers > 0 and dag.returns > 0
    assert dag.checkpoint_ms["p99"] < tree.checkpoint_ms["p99"]
    assert runs["tree"]["without"].node_deaths == runs["dag"]["without"].node_deaths == 0


def test_the_coordinator_completes_every_checkpoint_through_failures() -> None:
    """The real coordinator core checks every acknowledgement (a refused one is a
    RuntimeError of the shell): every checkpoint completes, DAG and tree."""
    for dag in (False, True):
        cfg = replace(
            BASE, checkpoints=40, coordinator=True, node_failures_per_hour=600.0, second_parents=dag
        )
        r = simulate(cfg)
        assert r.node_deaths > 0 and len(r.each_checkpoint_ms) == cfg.checkpoints


@pytest.mark.parametrize(
    "fields",
    [
        {"node_failures_per_hour": -1.0},
        {"restart_s": 0.0},
        {"failure_detection_s": -0.1},
        {"hold_down_s": -1.0},
        {"node_failures_per_hour": 1.0, "design": "task"},
    ],
)
def test_bad_failure_settings_are_refused(fields: dict) -> None:
    with pytest.raises(ValueError):
        SimConfig(**fields)


def test_compare_layouts_needs_failures() -> None:
    with pytest.raises(ValueError, match="node_failures_per_hour"):
        compare_layouts(BASE)
