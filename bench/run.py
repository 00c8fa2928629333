"""One bench run over several designs: storage set-up, the designs one after another,
metrics per design."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstltree.bench.designs import BenchSettings, DesignRun, run_design
from dstltree.bench.metrics import acceptance, compute_metrics
from dstltree.bench.storage import BenchStorage
from dstltree.topology.designs import TREE_DESIGNS

__all__ = ["BenchResult", "run_bench"]


@dataclass
class BenchResult:
    """Metrics per design (in run order), the tree acceptance checks and the raw runs."""

    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    acceptance: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, DesignRun] = field(default_factory=dict)


def run_bench(
    settings: BenchSettings,
    designs: Sequence[str],
    storage: BenchStorage,
    progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Run ``designs`` in order on ``storage`` (closed afterwards). Blocking."""
    out = BenchResult()
    with tempfile.TemporaryDirectory(prefix="dstl-bench-nodes-") as wd:
        try:
            for design in designs:
                if progress:
                    progress(design)
                run = run_design(design, settings, storage, Path(wd))
                storage.cleanup(design)
                m = compute_metrics(run, settings)
                out.runs[design] = run
                out.metrics[design] = m
                if design in TREE_DESIGNS:
                    out.acceptance[design] = acceptance(run, settings, m)
        finally:
            storage.close()
    return out
