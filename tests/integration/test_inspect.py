"""``dstl inspect`` through typer's CliRunner."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import typer
from typer.testing import CliRunner

from dstltree.cli.commands.inspect import register
from dstltree.client import ChangelogClient, ChangelogHandle
from dstltree.client.objectformat import FOOTER, MAGIC
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
    cs = CheckpointStore(store)
    newest = cs.head().seq
    assert newest is not None
    store.put(cs.record_path(newest), b"[1, 2")
    result = runner.invoke(_app(), ["inspect", str(tmp_path), "--json"])
    assert result.exit_code == 1 and f"commit-{newest:010d}.json" in result.output


def _rewrite_index(obj: str, change: Callable[[list[list[Any]]], None]) -> None:
    """Rewrite the index rows of object ``obj`` with ``change`` and give the index a
    fresh checksum and footer: every checksum agrees, only the index lies."""
    raw = Path(obj).read_bytes()
    _, version, _, index_offset, index_length, _ = FOOTER.unpack(raw[-FOOTER.size :])
    doc = msgpack.unpackb(raw[index_offset : index_offset + index_length])
    change(doc["segments"])
    index = msgpack.packb(doc)
    footer = FOOTER.pack(MAGIC, version, 0, index_offset, len(index), zlib.crc32(index))
    Path(obj).write_bytes(raw[:index_offset] + index + footer)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [(2, 7, "sqn_to"), (3, [1], "key groups"), (0, "log-b", "log id"), (1, 1, "sqn_from")],
)
def test_lying_index_exits_non_zero_naming_path_and_offset(
    tmp_path: Path, field: int, value: Any, reason: str
) -> None:
    _, _, h = _populate(str(tmp_path))
    (ref,) = h.segments

    def lie(rows: list[list[Any]]) -> None:
        rows[0][field] = value

    _rewrite_index(ref.path, lie)
    for args in (["inspect", ref.path], ["inspect", ref.path, "--json"]):
        result = runner.invoke(_app(), args)
        assert result.exit_code == 1, result.output
        assert f"corrupt object {ref.path} at offset {ref.offset}" in result.output
        assert reason in result.output and "{" not in result.stdout


def test_malformed_index_row_exits_non_zero(tmp_path: Path) -> None:
    _, _, h = _populate(str(tmp_path))
    (ref,) = h.segments

    def garble(rows: list[list[Any]]) -> None:
        rows[0][4] = "zero"  # an offset that is not an integer

    _rewrite_index(ref.path, garble)
    result = runner.invoke(_app(), ["inspect", ref.path])
    assert result.exit_code == 1
    assert f"corrupt object {ref.path} at offset" in result.output and "bad index" in result.output
