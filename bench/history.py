"""The history checker of the fault runs: what a writer was told is durable, held
against what its latest handle reads back (Jepsen's question for a log: is every
acknowledged write there, once, in order?).

A :class:`WriterHistory` records, per writer, the changes (key group, bytes) covered by
its latest acknowledged handle; :func:`check` restores that handle from the store and
counts acknowledged changes missing (all of a handle that cannot be read back), changes
read twice, key groups whose changes are out of the order they were appended in, and
objects the handle names that are gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dstltree.client.errors import CorruptObjectError
from dstltree.client.handle import ChangelogHandle
from dstltree.client.reader import iter_changes
from dstltree.storage.errors import StorageError
from dstltree.storage.store import ObjectStore

__all__ = ["HistoryCheck", "WriterHistory", "check"]


@dataclass
class WriterHistory:
    """One writer's acknowledged history: ``acked`` the changes its latest
    acknowledged handle ``handle`` covers, in the order appended."""

    acked: list[tuple[int, bytes]] = field(default_factory=list)
    handle: ChangelogHandle | None = None

    def acknowledged(self, handle: ChangelogHandle, appended: Iterable[tuple[int, bytes]]) -> None:
        """``handle`` was acknowledged; it covers ``appended`` (all changes so far)."""
        self.handle, self.acked = handle, list(appended)


@dataclass
class HistoryCheck:
    """Counts over every history checked (0 everywhere is a pass)."""

    checked: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    missing_objects: int = 0
    referenced: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.missing_objects)


def check(store: ObjectStore, histories: Iterable[WriterHistory]) -> HistoryCheck:
    """Read every history's handle back from ``store`` and compare (module docstring);
    ``referenced``: the objects the handles name (for an orphan scan after)."""
    out = HistoryCheck()
    for h in histories:
        out.checked += len(h.acked)
        if h.handle is None:
            out.lost += len(h.acked)
            continue
        paths = h.handle.object_paths()
        out.referenced |= paths
        out.missing_objects += sum(not store.exists(p) for p in paths)
        try:
            got = [(kg, c) for _, kg, c in iter_changes(store, h.handle)]
        except (StorageError, CorruptObjectError):  # an object gone or damaged
            out.lost += len(h.acked)
            continue
        out.lost += len(set(h.acked) - set(got))
        out.duplicated += len(got) - len(set(got))
        groups = {kg for kg, _ in h.acked} | {kg for kg, _ in got}
        out.out_of_order += sum(
            [c for g, c in got if g == kg] != [c for g, c in h.acked if g == kg] for kg in groups
        )
    return out
