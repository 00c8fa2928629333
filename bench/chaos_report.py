"""The chaos benchmark's report (``dstl bench chaos``): the table, one row per case,
and the "Chaos" section of BENCHMARKS.md with how each case is measured."""

from __future__ import annotations

from dstltree.bench.chaos import ChaosResult
from dstltree.bench.hotpath import markdown_table

__all__ = ["HEADERS", "NET_SECTION", "SECTION", "markdown_section", "table_rows"]

SECTION = "Chaos"
NET_SECTION = "Chaos: network faults"  # runs with partitions or one-way cuts
HEADERS = (
    "case",
    "kills (root)",
    "stops (root)",
    "cuts (root) / one-way",
    "detected: median / max ms (undetected)",
    "one-way failover median ms",
    "persists",
    "p50 ms",
    "p99 ms",
    "max ms",
    "p99 / no faults",
    "lost / dup / order",
    "missing objects",
    "direct DFS writes",
    "failovers (resent)",
    "orphans (reserved) -> after sweep",
)


def _detected(r: ChaosResult) -> str:
    if not (r.stops or r.partitions or r.oneways):
        return "-"
    return f"{r.detect_p50_s * 1e3:.0f} / {r.detect_max_s * 1e3:.0f} ({r.undetected})"


def table_rows(results: list[ChaosResult]) -> list[list[str]]:
    """One row per case; the p99 ratio is against the first case without faults."""
    calm = next(
        (r for r in results if r.kills + r.stops + r.partitions + r.oneways == 0 and r.p99_s > 0),
        None,
    )
    rows = []
    for r in results:
        ratio = f"{r.p99_s / calm.p99_s:.2f}x" if calm is not None else "-"
        rows.append(
            [
                r.case,
                f"{r.kills} ({r.root_kills})",
                f"{r.stops} ({r.root_stops})",
                f"{r.partitions} ({r.root_partitions}) / {r.oneways}",
                _detected(r),
                f"{r.oneway_p50_s * 1e3:.0f}" if r.oneway_p50_s > 0 else "-",
                str(r.persists),
                f"{r.p50_s * 1e3:.1f}",
                f"{r.p99_s * 1e3:.1f}",
                f"{r.max_s * 1e3:.0f}",
                ratio,
                f"{r.lost} / {r.duplicated} / {r.out_of_order}",
                str(r.missing_objects),
                str(r.fallbacks),
                f"{r.failovers} ({r.resent})",
                f"{r.orphans_found} ({r.reservations_found}) -> {r.orphans_after_sweep}",
            ]
        )
    return rows


_HOW = """How each case is measured (dstltree/bench/chaos.py): 7 node processes in
deploy/local.yaml's shape (CURVE on, `parent_timeout` 2 s; wire version 2: writers and
nodes ping every 0.05 s and take a peer silent for 0.15 s as lost, ZeroMQ's own
heartbeats every 0.1 s as before), 16 writer threads in the benchmark's process,
each persisting 3 changes of 1,000 bytes every 0.2 s (`persist_durably` to a durable
handle: the latency), ack timeout 10 s, hold-down 5 s. The faults: every 1-2 s
(uniform, seed 7) a random node, the root included, is either SIGKILLed and started
again at once with the same id, endpoint and parents, or SIGSTOPped for 1-5 s and then
SIGCONTed (a stopped node is not chosen for another stop; a kill ends a stop). A
stop's detection: from the SIGSTOP to the first failover away from that node, while it
was stopped, by a writer that was on it before the stop (its failover log) or a node
linked to it before the stop (its log of silent upstream nodes; a killed incarnation's
log is lost); "undetected": stops nobody using the node before them left.
With `--faults partitions,oneway` (dstltree/bench/chaos_net.py) every node runs in a
network namespace of its own, joined to the benchmark's host (the writers') by a Linux
bridge, in every case of the run: a partition cuts a random node's host (the root
included) off for 1-10 s (its link down: packets dropped, connections hang); a one-way
cut drops one direction between a node below the root and its first parent for 1-10 s
(a blackhole route), detected by the node's move away from that parent.
"dag": second parents and two nodes per writer (its own, then the next one's); "tree":
first parents only and one node per writer. Afterwards every writer's acknowledged
changes are read back through its last handle (lost, duplicated, out of order per key
group), every object a handle names must exist, and the files no handle references
once the nodes stopped are counted (empty object files a killed node had reserved in
brackets), deleted as the registry's sweep does, and counted again.
"""


_SEE = """How each case is measured: as in the "{base}" section; the options of the
command above narrow which nodes get faults and when.
"""


def markdown_section(
    results: list[ChaosResult], meta: dict[str, str], nproc: int, section: str = SECTION
) -> str:
    """The ``## <section>`` section of BENCHMARKS.md (``Chaos``, or ``Chaos: network
    faults`` for a run with them, a variant's name after a comma): command, commit,
    date, the table, and how each case is measured (a variant points to its base)."""
    lines = [
        f"## {section}",
        "",
        f"`{meta['command']}` on commit {meta['commit']}, {meta['date']}, `nproc` = {nproc} "
        "(shared and noisy: compare the ratios of one run).",
        "",
        *markdown_table(HEADERS, table_rows(results)),
    ]
    base = section.split(",", 1)[0]
    how = _HOW if base == section else _SEE.format(base=base)
    return "\n".join(lines) + "\n\n" + how
