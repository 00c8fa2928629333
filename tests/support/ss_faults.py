"""Faults for Structured Streaming tests: a Python worker that dies once mid-batch, and
the checkpoint a driver leaves when it dies after a batch's state but before its commit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _pass_or_die(marker_dir: str, batch_id: int) -> bool:
    """True, except for the first row of batch ``batch_id`` seen while its marker file
    ``fail-<batch id>`` exists: that row's task renames the marker (atomic, so exactly
    one task of the whole batch wins) to ``fail-<batch id>.fired`` and exits its Python
    worker process at once, as a killed worker would."""
    marker = os.path.join(marker_dir, f"fail-{batch_id}")
    try:
        os.rename(marker, marker + ".fired")
    except FileNotFoundError:
        return True
    os._exit(17)


def die_once_filter(marker_dir: Path) -> Any:
    """A nondeterministic Python UDF ``(batch id) -> true`` for ``DataFrame.filter``
    that kills its worker once per batch whose marker :func:`arm` created (Spark then
    fails the task and runs it again). Nondeterministic, so the optimizer neither pushes
    it below the operator before it nor drops it."""
    from pyspark.sql import functions as F

    folder = str(marker_dir)
    return F.udf(lambda b: _pass_or_die(folder, b), "boolean").asNondeterministic()


def arm(marker_dir: Path, batch_id: int) -> Path:
    """Make the next task of batch ``batch_id`` through :func:`die_once_filter` die;
    returns the file that exists once it did."""
    marker_dir.mkdir(parents=True, exist_ok=True)
    (marker_dir / f"fail-{batch_id}").touch()
    return marker_dir / f"fail-{batch_id}.fired"


def drop_last_commit(checkpoint: Path) -> int:
    """Delete the newest ``commits/<N>`` (and its checksum file) of ``checkpoint``: the
    checkpoint a driver leaves when it dies after batch N's state files were written
    but before it wrote the batch's commit. Returns N."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    crc = commits / f".{last}.crc"
    if crc.exists():
        crc.unlink()
    return last
