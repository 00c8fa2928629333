"""``python -m sparkplug.bench.node_main``: one aggregator node for the benchmark.

The same node as ``python -m aggregator`` (``aggregator.process.build_node`` from a
topology file, served until SIGTERM, final statistics written with
``aggregator.process.write_stats``), plus one thing the benchmark needs and the stock
entry point lacks: on SIGUSR1 it writes a statistics snapshot to ``--snapshot-file``
without stopping, so the driver can split counters (bytes relayed, CPU, uploads) at a
plan-window boundary.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
from pathlib import Path

from aggregator.process import build_node, write_stats
from topology.config import load_topology

_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sparkplug.bench.node_main")
    p.add_argument("--topology", required=True, type=Path)
    p.add_argument("--node-id", required=True)
    p.add_argument("--depth", type=int, default=0)
    p.add_argument("--parent", default=None)
    p.add_argument("--base-path", required=True)
    p.add_argument("--address-file", required=True, type=Path)
    p.add_argument("--stats-file", required=True, type=Path)
    p.add_argument("--snapshot-file", required=True, type=Path)
    p.add_argument("--exit-with-pid", type=int, required=True)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s node {a.node_id} %(message)s")
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # the node thread inherits the mask
    topo = load_topology(a.topology, base_path=a.base_path)
    node = build_node(topo, a.node_id, a.depth, "tcp://127.0.0.1:0", a.parent)
    tmp = a.address_file.with_suffix(".tmp")
    tmp.write_text(node.address)
    tmp.replace(a.address_file)
    thread = node.start()
    while thread.is_alive():
        sig = signal.sigtimedwait(_SIGNALS, 1.0)
        if sig is None:
            try:
                os.kill(a.exit_with_pid, 0)
            except ProcessLookupError:
                break
            continue
        if sig.si_signo == signal.SIGUSR1:
            write_stats(node, a.snapshot_file)
        else:
            break
    node.stop()
    thread.join(30.0)
    with contextlib.suppress(OSError):
        write_stats(node, a.stats_file)


if __name__ == "__main__":
    main()
