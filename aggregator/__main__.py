"""``python -m aggregator``: the same as ``dstl node`` (kept free of Spark imports)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aggregator.process import run_node
from topology.config import load_topology


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m aggregator", description="Run one aggregator node.")
    p.add_argument("--topology", required=True, type=Path)
    p.add_argument("--node-id", required=True)
    p.add_argument("--depth", type=int, default=0)
    p.add_argument("--bind", default="tcp://127.0.0.1:0")
    p.add_argument("--parent", default=None, help="the parent's ZeroMQ endpoint")
    p.add_argument("--address-file", type=Path, default=None)
    p.add_argument("--exit-with-pid", type=int, default=None)
    p.add_argument("--base-path", default=None)
    p.add_argument("--stats-file", type=Path, default=None)
    p.add_argument("--snapshot-file", type=Path, default=None, help="statistics on SIGUSR1")
    p.add_argument("--no-plans", action="store_true", help="forward hop by hop (no plans)")
    a = p.parse_args()
    topo = load_topology(a.topology, base_path=a.base_path, plans=False if a.no_plans else None)
    run_node(topo, a.node_id, a.depth, a.bind, a.parent, a.address_file, a.exit_with_pid,
             a.stats_file, a.snapshot_file)  # fmt: skip


if __name__ == "__main__":
    main()
