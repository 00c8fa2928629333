"""``dstl inspect`` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from dstltree.cli.commands.inspect import register
from dstltree.client import ChangelogClient, ChangelogHandle
from dstltree.coordinator.checkpoint import CompletedCheckpoint, MaterializedRef, TaskCheckpoint
from dstltree.coordinator.store import CheckpointStore
from dstltree.storage.store import ObjectStore

runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """dstl (test)."""

    register(app)
    return app


def _populate(base: str) -> tuple[list[str], list[str], ChangelogHandle]:
    """Two objects, one referenced by checkpoint 1 with a snapshot; returns
    (referenced, orphans, the handle of the referenced object's one segment)."""
    client = ChangelogClient.open(base)
    w = client.create_writer("log-a", range(0, 4))
    w.append(1, b"one")
    w.append(2, b"two")
    h = w.persist_durably(0).result(timeout=10)
    w.append(3, b"three")
    orphan_handle = w.persist_durably(h.sqn_range[1]).result(timeout=10)
    client.close()
    store = ObjectStore(base)
    snap = store.new_snapshot_path()
    store.put(snap, b"snapshot")
    tc = TaskCheckpoint(0, 0, 2, MaterializedRef(snap, 0, 8), (h,))
    CheckpointStore(store).add(CompletedCheckpoint(1, 0, 1, 0.0, 0.1, {0: tc}))
    (obj,) = h.object_paths()
    referenced = sorted([obj, snap])
    orphans = sorted(orphan_handle.object_paths())
    return referenced, orphans, h


def test_inspect_base_path_json(tmp_path: Path) -> None:
    referenced, orphans, _ = _populate(str(tmp_path))
    result = runner.invoke(_app(), ["inspect", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["latest_checkpoint"] == 1
    assert info["referenced"] == referenced
    assert info["orphans"] == orphans
    assert info["present"] == sorted(referenced + orphans)
    assert info["missing"] == []
    text = runner.invoke(_app(), ["inspect", str(tmp_path), "--storage-options", "{}"])
    assert text.exit_code == 0 and "latest checkpoint:   1" in text.stdout


def test_inspect_object_lists_segments(tmp_path: Path) -> None:
    _, _, h = _populate(str(tmp_path))
    (ref,) = h.segments
    obj = ref.path
    result = runner.invoke(_app(), ["inspect", obj, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    (seg,) = info["segments"]
    assert seg["log_id"] == "log-a" and seg["sqn"] == [0, 1]
    assert seg["key_groups"] == [1, 2] and seg["offset"] == ref.offset == 0
    assert seg["length"] == ref.length  # the index agrees with the writer's handle
    text = runner.invoke(_app(), ["inspect", obj])
    assert text.exit_code == 0 and "log-a" in text.stdout and "[0, 1)" in text.stdout


def test_corrupt_object_and_metadata_fail_clearly(tmp_path: Path) -> None:
    _, _, h = _populate(str(tmp_path))
    (obj,) = h.object_paths()
    data = bytearray(Path(obj).read_bytes())
    data[-3] ^= 0xFF  # inside the footer's index checksum
    Path(obj).write_bytes(bytes(data))
    result = runner.invoke(_app(), ["inspect", obj])
    assert result.exit_code == 1  # corrupt, not a storage failure (2)
    assert obj in result.output and "offset" in result.output
    store = ObjectStore(str(tmp_path))
    store.put(CheckpointStore(store).metadata_path(1), b"[1, 2")
    result = runner.invoke(_app(), ["inspect", str(tmp_path), "--json"])
    assert result.exit_code == 1 and "chk-0000000001.json" in result.output
