"""The writer keeps changes packed (a length table and a body per key group): what it
uploads reads back as exactly the changes appended or staged, per key group in order,
after failed uploads, re-uploads and truncation too."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.client.errors import PersistError
from dstltree.client.writer import ChangelogWriter
from tests.unit.test_writer_staging import KGS, MemoryUploader

_CHANGE = st.binary(max_size=30)
_op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(KGS), _CHANGE),
    st.tuples(st.just("stage"), st.sampled_from(KGS), _CHANGE),
    st.tuples(st.just("next_sqn")),
    st.tuples(st.just("fail_next")),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_op, max_size=50), st.integers(0, 3))
def test_uploaded_changes_read_back_as_appended(ops: list[tuple[Any, ...]], cut: int) -> None:
    up = MemoryUploader()
    w = ChangelogWriter("w", KGS, up, preemptive_bytes=1 << 40)
    logged: list[tuple[int, int, bytes]] = []  # (sqn, key group, change)
    for op in ops:
        if op[0] == "append":
            w.append(op[1], op[2])
            logged.append((w.statistics().active_sqn, op[1], op[2]))
        elif op[0] == "stage":
            w.staging(op[1]).append(op[2])
            logged.append((w.statistics().active_sqn, op[1], op[2]))
        elif op[0] == "next_sqn":
            w.next_sqn()
        else:
            up.fail_next = 1  # the next upload fails (none if nothing is new)
            with contextlib.suppress(PersistError):
                w.persist_durably(w.truncated_before).result(timeout=10)
            up.fail_next = 0
    before = min(cut, w.next_sqn())
    w.truncate(before)
    handle = w.persist_durably(before).result(timeout=10)
    expected = sorted((c for c in logged if c[0] >= before), key=lambda c: (c[0], c[1]))
    assert up.read(handle) == expected
    stats = w.statistics()
    assert stats.bytes_in_memory == sum(len(c) for s, _, c in logged if s >= before)
