"""The simulator's tree designs on the real coordinator core (simulations/coordshell.py):
every checkpoint completes through the core with its invariants checked, completion
follows the last acknowledgement, checkpoints never overlap, runs are deterministic.
Small configurations; no timed assertions (simulated time only)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dstltree.coordinator.checkpoint import path_problem
from dstltree.simulations import SimConfig, simulate
from dstltree.simulations.cluster import _Sim
from dstltree.simulations.coordshell import CoordinatorCluster

_SMALL = SimConfig(
    executors=7,
    tasks_per_executor=3,
    branching=2,
    checkpoints=5,
    plan_window=2,
    distribution="lognormal",
    coordinator=True,
    check_invariants=True,  # NodeCore and CoordinatorState validate after every event
)


def _run(cfg: SimConfig) -> tuple[_Sim, CoordinatorCluster]:
    sim = _Sim(cfg)
    sim.run()
    assert sim.coord is not None
    return sim, sim.coord


@pytest.mark.parametrize("design", ["tree", "tree-noplan"])
def test_every_checkpoint_completes_through_the_core(design: str) -> None:
    cfg = replace(_SMALL, design=design)  # type: ignore[arg-type]
    sim, coord = _run(cfg)
    core = coord.core
    total = cfg.warmup + cfg.checkpoints
    assert sorted(coord.completed) == list(range(total))
    assert core.checkpoints_completed == total and core.checkpoints_aborted == 0
    assert core.messages_rejected == 0 and core.messages_fenced == 0
    assert len(core.retained) == core.config.retained_checkpoints
    # the latest checkpoint names every task, each with a handle per checkpoint so far
    latest = core.latest
    assert latest is not None and latest.checkpoint_id == total
    assert len(latest.tasks) == cfg.executors * cfg.tasks_per_executor
    assert all(len(tc.changelog) == total for tc in latest.tasks.values())
    prefixes = core.config.object_prefixes
    assert all(path_problem(p, prefixes) is None for p in latest.referenced_paths())
    # the core's own durations are what the run reports
    durations = [coord.completed[c] - coord.triggered[c] for c in range(total)]
    assert core.checkpoint_durations_s == pytest.approx(durations)


def test_completion_follows_the_last_ack_and_checkpoints_do_not_overlap() -> None:
    # an interval longer than the start-up: the first trigger waits until it is due
    cfg = replace(_SMALL, checkpoint_interval_s=1.5)
    sim, coord = _run(cfg)
    assert coord.triggered[0] == pytest.approx(cfg.checkpoint_interval_s, abs=0.011)
    for c in sorted(coord.completed):
        trigger, end, last_ack = sim.spans(c)
        # the trigger reaches the tasks a hop later; the last ack needs a hop back
        assert trigger + cfg.hop_latency_s <= last_ack
        assert last_ack + cfg.hop_latency_s <= end
        if c + 1 in coord.triggered:
            assert coord.triggered[c + 1] >= end + cfg.checkpoint_interval_s
    assert not sim.nodes or not sim.nodes.left  # every writer got its ack


def test_results_are_deterministic_for_a_seed() -> None:
    cfg = replace(_SMALL, check_invariants=False, executors=20, checkpoints=4)
    a, b = simulate(cfg), simulate(cfg)
    for key in ("checkpoint_ms", "writers_ms", "coordinator_ms", "each_checkpoint_ms"):
        assert getattr(a, key) == getattr(b, key)
    assert a.requests_per_checkpoint == b.requests_per_checkpoint
    assert a.coordinator and a.coordinator_ms
    other = simulate(replace(cfg, seed=1))
    assert other.each_checkpoint_ms != a.each_checkpoint_ms


def test_the_coordinators_cpu_per_ack_shows_in_its_share() -> None:
    """Every task's ack costs the coordinator ``cpu_per_message_s``: 21 acks at 20 ms
    each put most of 420 ms between the last writer's ack and the completion."""
    base = replace(_SMALL, check_invariants=False, dfs_latency="local")
    cheap = simulate(base)
    slow = simulate(replace(base, cpu_per_message_s=0.02))
    assert slow.coordinator_ms["p50"] > cheap.coordinator_ms["p50"] + 100
    assert slow.writers_ms["p50"] < slow.checkpoint_ms["p50"]


def test_fixed_trigger_without_the_coordinator() -> None:
    cfg = replace(_SMALL, check_invariants=False, coordinator=False)
    r = simulate(cfg)
    assert not r.coordinator and r.coordinator_ms == {}
    assert r.checkpoint_ms == r.writers_ms  # latency to the last writer's ack
    flat = simulate(replace(cfg, design="task", coordinator=True))
    assert not flat.coordinator  # task and executor designs keep the fixed trigger


def test_the_core_checks_what_simulated_tasks_acknowledge() -> None:
    """Acks pass the core's real checks: objects named outside the job's prefixes are
    refused, and the shell stops with the refusal rather than counting it done."""
    sim = _Sim(replace(_SMALL, check_invariants=False))
    assert sim.nodes is not None and sim.coord is not None
    sim.nodes.object_path = lambda: "s3://elsewhere/o1.dstl"
    with pytest.raises(RuntimeError, match="outside this job's object prefixes"):
        sim.run()
