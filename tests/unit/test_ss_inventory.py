"""``dstl inspect`` counts the objects Structured Streaming bridges' manifests
reference (structured_streaming/inventory.py): the newest manifest of each query only,
its files' segments and older versions; others are orphans, absent ones missing."""

from __future__ import annotations

import json
from pathlib import Path

from dstltree.cli.commands.inspect import inspect_base
from dstltree.structured_streaming.inventory import manifest_object_roles, manifest_objects


def _entry(obj: Path, older: tuple[Path, ...] = (), deleted: bool = False) -> dict:
    segment = {"path": f"file://{obj}", "offset": 0, "length": 3, "sqn": [1, 2]}
    return {"sqn": 1, "length": -1 if deleted else 3, "deleted": deleted,
            "segment": {**segment, "crc32": 0, "key_groups": [0, 1]},
            "older": [f"file://{o}" for o in older]}  # fmt: skip


def _manifest(folder: Path, seq: int, files: dict[str, dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": 1, "root": f"file:/ckpt/{folder.name}", "seq": seq, "files": files}
    (folder / f"manifest-{seq}.json").write_text(json.dumps(doc))


def test_inspect_counts_the_newest_manifests_objects(tmp_path: Path) -> None:
    objects = tmp_path / "changelog" / "ab"
    objects.mkdir(parents=True)
    x, y, z, w, gone = (objects / f"{n}.dstl" for n in ("x", "y", "z", "w", "gone"))
    for o in (x, y, z, w):
        o.write_bytes(b"obj")
    _manifest(tmp_path / "ss" / "q1", 1, {"state/0/0/1.changelog": _entry(z)})
    _manifest(tmp_path / "ss" / "q1", 2, {"state/0/0/2.changelog": _entry(x, older=(y,))})
    _manifest(tmp_path / "ss" / "q2", 7, {"state/0/1/3.delta": _entry(gone, deleted=True)})

    info = inspect_base(str(tmp_path), {})
    assert info["ss_queries"] == ["file:/ckpt/q1", "file:/ckpt/q2"]
    assert [Path(p).name for p in info["referenced"]] == ["gone.dstl", "x.dstl"]
    assert [Path(p).name for p in info["orphans"]] == ["w.dstl", "z.dstl"]  # z: an old manifest's
    assert [Path(p).name for p in info["missing"]] == ["gone.dstl"]


def test_older_versions_awaiting_release_are_neither_orphans_nor_missing(tmp_path: Path) -> None:
    objects = tmp_path / "changelog" / "ab"
    objects.mkdir(parents=True)
    tomb, held, released = (objects / f"{n}.dstl" for n in ("tomb", "held", "released"))
    tomb.write_bytes(b"obj")
    held.write_bytes(b"obj")
    doc = {"state/0/0/1.changelog": _entry(tomb, older=(held, released), deleted=True)}
    _manifest(tmp_path / "ss" / "q", 3, doc)
    info = inspect_base(str(tmp_path), {})
    assert info["orphans"] == [] and info["missing"] == []


def test_manifest_objects_of_an_empty_manifest() -> None:
    empty = {"format": 1, "root": "file:/c", "seq": 0, "files": {}}
    assert manifest_object_roles(empty) == (set(), set()) and manifest_objects(empty) == set()
