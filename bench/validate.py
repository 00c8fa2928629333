"""``dstl simulate --validate``: the simulator against the real tree.

One small configuration runs twice for real through the ``dstl bench`` machinery
(:func:`dstltree.bench.run.run_bench`, design ``tree``: one node process per node of
``deploy/local.yaml``'s 7-node, 3-level tree, one executor process per node, 4 writers
each = 28 writers, constant bytes per writer per checkpoint, hedging off):

1. calibration: on the plain local filesystem (no injected latency). Its persist p50
   is the machine's own overhead (executor pipe, segment encoding, ZeroMQ hops, node
   CPU, a local file write); the simulator's per-hop latency is fitted (bisection) so
   that the simulator, on the ``local`` disk model, has the same p50;
2. validation: on the fault-injecting filesystem with the FLIP-158 S3 model scaled by
   ``scale`` (PUT latency only). The simulator runs the same tree, writers, segment
   size, checkpoints, plan window, target, persist delay and scaled model through the
   real node core (:mod:`dstltree.simulations.nodeshell`) with the fitted hop latency.

Both sides are compared over EVERY checkpoint: window 0 (hop by hop, no plan yet), the
windows planned from the first estimates and every plan change included. Requests per
checkpoint (hedging off and no injected errors, so one PUT per object: objects are
counted per checkpoint as the distinct object paths of its new segments on the real
side, the distinct objects holding its segments in the simulator) must agree exactly,
per checkpoint and on average; persist latency p50/p90 (from the checkpoint trigger to
the last writer's handle) within 25 %.

The target is 11.5 segments: the two inner nodes each gather 12 segments (their own 4
and 4 from each leaf) and are writer nodes once plans carry estimates; leaves are not.
Every batch grows in whole segments, so a size flush always cuts at exactly 12
segments.

The persist delay is 0.5 s, twice the checkpoint interval, so that every flush on both
sides is decided by the size cut or the all-persisted rule, which depend only on what
arrived and not on when. With a delay close to the real hop and PUT times (such as the
node's default 0.05 s) a writer's request delayed by scheduling noise on a loaded
machine lets the delay flush fire on the real side only (an extra object cut) while the
simulator, which has no such noise, waits for the last writer. Should a flush ever wait
for the delay, that checkpoint's persist latency exceeds 500 ms and the p90 comparison
fails.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dstltree.stats import percentile

__all__ = ["ValidateSettings", "print_validation", "run_validation"]

_TOPOLOGY = Path(__file__).resolve().parent.parent / "deploy" / "local.yaml"
KiB = 1024


@dataclass(frozen=True)
class ValidateSettings:
    """The configuration of one validation. Sizes in bytes, times in seconds."""

    checkpoints: int = 28
    plan_window: int = 4
    checkpoint_interval: float = 0.25
    tasks_per_executor: int = 4
    bytes_per_writer: int = 64 * KiB
    target_segments: float = 11.5
    scale: float = 0.1
    persist_delay: float = 0.5  # > interval: noise cannot reach it (module docstring)
    cpu_per_message_s: float = 50e-6
    seed: int = 0
    calibrate: bool = True
    hop_latency_s: float = 0.0005  # used when calibrate is False
    topology: Path = field(default=_TOPOLOGY)

    @property
    def target_object_bytes(self) -> int:
        return int(self.target_segments * self.bytes_per_writer)


@dataclass(frozen=True)
class _RealRun:
    requests: list[int]  # objects per checkpoint, all checkpoints
    persist_ms: list[float]
    segment_bytes: float
    uploads: int  # PUT attempts and retries counted by the upload paths
    fallback_segments: int


def _real(vs: ValidateSettings, faults: str | None) -> _RealRun:
    from dstltree.bench.designs import BenchSettings
    from dstltree.bench.metrics import segments_of, upload_requests
    from dstltree.bench.run import run_bench
    from dstltree.bench.storage import BenchStorage
    from dstltree.bench.workload import Workload
    from dstltree.storage.faults import FaultSpec
    from dstltree.topology.config import load_topology

    topo = load_topology(vs.topology)
    tree = topo.tree(None)
    n = len(tree)
    doc = topo.model_dump(
        mode="json", exclude={"nodes", "branching", "hosts", "node_port", "bind_all"}
    )
    doc["persist_delay"] = vs.persist_delay
    wl = Workload(n * vs.tasks_per_executor, n, vs.bytes_per_writer, vs.checkpoints, seed=vs.seed)
    settings = BenchSettings(
        workload=wl,
        topology=doc,
        tree=tree,
        target_object_bytes=vs.target_object_bytes,
        plan_window=vs.plan_window,
        checkpoint_interval=vs.checkpoint_interval,
        attempts=1,
    )
    spec = FaultSpec.parse(faults).with_seed(vs.seed) if faults else None
    result = run_bench(settings, ["tree"], BenchStorage(faults=spec))
    run = result.runs["tree"]
    paths: defaultdict[int, set[str]] = defaultdict(set)
    lengths = []
    fallback = 0
    for s in segments_of(run):
        paths[s.k].add(s.path)
        lengths.append(s.length)
        fallback += s.writer.startswith("x-")
    uploads, _hedged = upload_requests(run)
    return _RealRun(
        [len(paths[cp.k]) for cp in run.checkpoints],
        [cp.persist_s * 1000 for cp in run.checkpoints],
        statistics.fmean(lengths),
        uploads,
        fallback,
    )


def _sim_config(
    vs: ValidateSettings, segment_bytes: int, model: str, scale: float, hop: float
) -> Any:
    from dstltree.simulations.config import SimConfig
    from dstltree.topology.config import load_topology

    tree = load_topology(vs.topology).tree(None)
    return SimConfig(
        executors=len(tree),
        tasks_per_executor=vs.tasks_per_executor,
        tree=tree,
        bytes_per_checkpoint=segment_bytes,
        checkpoints=vs.checkpoints,
        warmup_checkpoints=0,
        checkpoint_interval_s=vs.checkpoint_interval,
        plan_window=vs.plan_window,
        target_object_bytes=vs.target_object_bytes,
        design="tree",
        dfs_latency=model,
        dfs_latency_scale=scale,
        hedge_timeout_s=None,
        max_attempts=1,
        hop_latency_s=hop,
        cpu_per_message_s=vs.cpu_per_message_s,
        persist_delay_s=vs.persist_delay,
        seed=vs.seed,
    )


def _fit_hop(vs: ValidateSettings, segment_bytes: int, target_p50_ms: float) -> float:
    """The per-hop latency (s) at which the simulator on the ``local`` disk model has
    persist p50 ``target_p50_ms`` (bisection; 0 if even no hop latency is slower)."""
    from dstltree.simulations.cluster import simulate

    def p50(hop: float) -> float:
        return simulate(_sim_config(vs, segment_bytes, "local", 1.0, hop)).checkpoint_ms["p50"]

    lo, hi = 0.0, 0.5
    if p50(lo) >= target_p50_ms:
        return 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if p50(mid) < target_p50_ms:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _within(sim: float, real: float, tol: float = 0.25) -> bool:
    return real > 0 and abs(sim - real) / real <= tol


def run_validation(
    vs: ValidateSettings, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the calibration, the real validation run and the simulator; returns the JSON
    document (both sides, calibration, ``agree`` booleans, ``wall_s``)."""
    from dstltree.simulations.cluster import simulate

    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    calibration = _calibration(vs, say)
    faults = f"flip158-s3,scale={vs.scale:g},ops=put"
    say(f"real tree on the fault-injecting filesystem ({faults})")
    real = _real(vs, faults)
    seg = round(real.segment_bytes)
    say("simulator")
    sim = simulate(_sim_config(vs, seg, "flip158-s3", vs.scale, calibration["hop_latency_s"]))
    real_doc = _real_doc(vs, real)
    sim_p = {k: sim.checkpoint_ms[k] for k in ("p50", "p90")}
    real_p = real_doc["persist_ms"]
    return {
        "config": _config_doc(vs, seg, sim.executors, faults),
        "calibration": calibration,
        "real": real_doc,
        "sim": {
            "requests_per_checkpoint": sim.objects_per_checkpoint,
            "requests_each_checkpoint": sim.objects_each_checkpoint,
            "persist_ms": sim_p,
            "result": sim.to_dict(),
        },
        "agree": {
            "requests_per_checkpoint": real_doc["requests_per_checkpoint"]
            == sim.objects_per_checkpoint,
            "requests_each_checkpoint": real_doc["requests_each_checkpoint"]
            == sim.objects_each_checkpoint,
            "p50_within_25pct": _within(sim_p["p50"], real_p["p50"]),
            "p90_within_25pct": _within(sim_p["p90"], real_p["p90"]),
        },
        "wall_s": time.perf_counter() - t0,
    }


def _calibration(vs: ValidateSettings, say: Callable[[str], None]) -> dict[str, Any]:
    """The hop latency and CPU per message the simulator uses: the settings' own, or
    with ``vs.calibrate`` the hop latency fitted to a real run on the local filesystem
    (persist p50 over every checkpoint), with both sides' p50/p90 (ms)."""
    from dstltree.simulations.cluster import simulate

    calibration: dict[str, Any] = {
        "hop_latency_s": vs.hop_latency_s,
        "cpu_per_message_s": vs.cpu_per_message_s,
    }
    if not vs.calibrate:
        return calibration
    say("calibration: real tree on the local filesystem (no injected latency)")
    cal = _real(vs, None)
    measured = cal.persist_ms
    cal_p50 = percentile(measured, 50)
    seg = round(cal.segment_bytes)
    hop = _fit_hop(vs, seg, cal_p50)
    sim_cal = simulate(_sim_config(vs, seg, "local", 1.0, hop))
    calibration.update(
        hop_latency_s=hop,
        real_local_p50_ms=cal_p50,
        real_local_p90_ms=percentile(measured, 90),
        sim_local_p50_ms=sim_cal.checkpoint_ms["p50"],
        sim_local_p90_ms=sim_cal.checkpoint_ms["p90"],
        method="hop latency fitted so that the simulator on the 'local' disk model "
        "reproduces the real tree's persist p50 on the local filesystem",
    )
    return calibration


def _real_doc(vs: ValidateSettings, real: _RealRun) -> dict[str, Any]:
    """The real side: requests and persist p50/p90 (ms) over every checkpoint, requests
    per plan window, and every checkpoint's values."""
    return {
        "requests_per_checkpoint": statistics.fmean(real.requests),
        "requests_per_window": [
            statistics.fmean(real.requests[i : i + vs.plan_window])
            for i in range(0, vs.checkpoints, vs.plan_window)
        ],
        "requests_each_checkpoint": real.requests,
        "persist_ms": {
            "p50": percentile(real.persist_ms, 50),
            "p90": percentile(real.persist_ms, 90),
        },
        "persist_ms_each_checkpoint": [round(x, 2) for x in real.persist_ms],
        "uploads_total": real.uploads,
        "objects_total": sum(real.requests),
        "fallback_segments": real.fallback_segments,
    }


def _config_doc(vs: ValidateSettings, seg: int, executors: int, faults: str) -> dict[str, Any]:
    """The settings plus what follows from them and the measured segment size."""
    return {
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(vs).items()},
        "executors": executors,
        "writers": executors * vs.tasks_per_executor,
        "target_object_bytes": vs.target_object_bytes,
        "segment_bytes": seg,
        "segment_overhead": seg / vs.bytes_per_writer - 1,
        "target_between_11_and_12_segments": 11 * seg < vs.target_object_bytes <= 12 * seg,
        "dfs_faults": faults,
        "hedging": "off",
        "measured_checkpoints": vs.checkpoints,
    }


def print_validation(doc: dict[str, Any]) -> None:
    """The real tree and the simulator side by side (rich table)."""
    from rich.console import Console
    from rich.table import Table

    cfg, real, sim, agree = doc["config"], doc["real"], doc["sim"], doc["agree"]
    t = Table(
        title=(
            f"dstl simulate --validate: {cfg['executors']} nodes, {cfg['writers']} writers, "
            f"{cfg['bytes_per_writer'] // KiB} KiB/writer, "
            f"target {cfg['target_object_bytes'] // KiB} KiB, "
            f"persist delay {cfg['persist_delay'] * 1000:.0f} ms, "
            f"{cfg['measured_checkpoints']} measured checkpoints, {cfg['dfs_faults']}"
        )
    )
    for col in ("metric", "real tree", "simulator", "sim/real", "agree"):
        t.add_column(col, justify="left" if col == "metric" else "right")

    def ratio(s: float, r: float) -> str:
        return f"{s / r:.2f}" if r else "-"

    t.add_row(
        "requests / checkpoint",
        f"{real['requests_per_checkpoint']:.2f}",
        f"{sim['requests_per_checkpoint']:.2f}",
        ratio(sim["requests_per_checkpoint"], real["requests_per_checkpoint"]),
        "yes" if agree["requests_per_checkpoint"] else "NO",
    )
    diff = sum(
        a != b
        for a, b in zip(
            real["requests_each_checkpoint"], sim["requests_each_checkpoint"], strict=False
        )
    )
    t.add_row(
        "requests, each checkpoint",
        " ".join(map(str, real["requests_each_checkpoint"])),
        " ".join(map(str, sim["requests_each_checkpoint"])),
        f"{diff} differ",
        "yes" if agree["requests_each_checkpoint"] else "NO",
    )
    for k in ("p50", "p90"):
        r, s = real["persist_ms"][k], sim["persist_ms"][k]
        ok = agree[f"{k}_within_25pct"]
        t.add_row(f"persist {k} (ms)", f"{r:.1f}", f"{s:.1f}", ratio(s, r), "yes" if ok else "NO")
    console = Console()
    console.print(t)
    cal = doc["calibration"]
    if "real_local_p50_ms" in cal:
        console.print(
            f"calibration (local filesystem): real p50 {cal['real_local_p50_ms']:.1f} ms, "
            f"simulator p50 {cal['sim_local_p50_ms']:.1f} ms with hop latency "
            f"{cal['hop_latency_s'] * 1000:.2f} ms and {cal['cpu_per_message_s'] * 1e6:.0f} us "
            "per message"
        )
    console.print(f"wall time {doc['wall_s']:.0f} s")
