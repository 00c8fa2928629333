"""Which file of a checkpoint location is what (structured_streaming/paths.py)."""

from __future__ import annotations

import pytest

from dstltree.structured_streaming import paths


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("state/0/3/12.changelog", paths.STATE),
        ("state/0/3/SSTs/000012-uuid.sst", paths.STATE),
        ("state/1/0/4_0a1b.zip", paths.STATE),
        ("offsets/7", paths.OFFSETS),
        ("commits/7", paths.COMMIT),
        ("sources/0/7", paths.LOG),
        ("sources/1/20.compact", paths.LOG),
        ("metadata", paths.LOG),
        ("state/0/_metadata/metadata", paths.META),
        ("state/0/3/_metadata/schema", paths.META),
        ("state/0/_stateSchema/default/0_uuid", paths.META),
        ("offsets/x", paths.META),
        ("commits", paths.META),
        ("anything/else", paths.META),
    ],
)
def test_kinds(path: str, kind: str) -> None:
    assert paths.kind(path) == kind


def test_only_metadata_files_are_durable_at_once() -> None:
    assert not paths.holdable("state/0/_metadata/metadata")
    assert all(paths.holdable(p) for p in ("state/0/1/1.delta", "sources/0/1", "offsets/1"))
