"""Writes tests/golden/formats-0.2/: the wire messages dstltree added after 0.1, written by
this version's own code, so that tests/unit/test_golden_formats.py checks that every later
version still reads them.

Run once, from the repository root, at the commit that adds it:
``PYTHONPATH=. .venv/bin/python tests/golden/make_formats_v0_2.py``. The files are
committed and never regenerated (formats-0.1/ holds every other format, unchanged in 0.2).

What it writes:

- ``wire.msgpack``: one msgpack array of the frame lists (``client.wire.dump``) of a note
  (addressed, broadcast, subscription only, passed on by a node) and of a persist whose
  item belongs to a flush group.
- ``expected.json``: what a reader gets back from each (``{"wire": [...]}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack

from dstltree.client import wire
from dstltree.client.batching import FlushGroup, PersistItem
from dstltree.client.segment import SegmentMeta
from tests.golden.make_formats_v0_1 import plain

OUT = Path(__file__).parent / "formats-0.2"


def messages() -> list[wire.Message]:
    """One sample of each wire shape added in 0.2."""
    data = b"golden segment bytes"
    meta = SegmentMeta("ss/0123456789abcdef/state/0/3/7.changelog", 5, 6, (0,), len(data), 9)
    item = PersistItem(meta, 7, data, group=FlushGroup("0123456789abcdef:7:c1", 2, "host-a", 3))
    return [
        wire.Note("host-b-1234abcd", "host-a-5678ef01", b"\x81\xa2op\xa5flush"),
        wire.Note(wire.BROADCAST, "host-a-5678ef01", b"drive", "node-a"),
        wire.Note("", "host-a-5678ef01", b""),
        wire.Persist((wire.PersistRequest(3, item),), None),
    ]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    frames = [[bytes(f) for f in wire.dump(m)] for m in messages()]
    loaded: list[Any] = [plain(wire.load(f)) for f in frames]
    (OUT / "wire.msgpack").write_bytes(msgpack.packb(frames))
    (OUT / "expected.json").write_text(json.dumps({"wire": loaded}, indent=1) + "\n")


if __name__ == "__main__":
    main()
