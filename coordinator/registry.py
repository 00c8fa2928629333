"""The shared state registry: reference counts per object path.

Follows the shared state registry of Flink's incremental checkpoints (FLINK-7449
documentation, reference/004): a completed checkpoint increments the count of every
object it references (once per checkpoint); a subsumed checkpoint decrements them; an
object whose count drops to zero is no longer needed by any retained checkpoint and may
be deleted. On restart the counts are rebuilt by registering every retained checkpoint
again. Objects are shared by many handles and checkpoints, so only the registry decides
deletions, and always by path.
"""

from __future__ import annotations

from collections.abc import Iterable

from dstltree.coordinator.checkpoint import CompletedCheckpoint


class SharedStateRegistry:
    """Reference counts (number of registered checkpoints referencing it) per path."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._registered: dict[int, frozenset[str]] = {}

    @classmethod
    def rebuild(cls, retained: Iterable[CompletedCheckpoint]) -> SharedStateRegistry:
        """A registry holding exactly the references of ``retained``."""
        reg = cls()
        for cp in retained:
            reg.register(cp)
        return reg

    def register(self, checkpoint: CompletedCheckpoint) -> None:
        """Count every path ``checkpoint`` references once more.
        Raises ValueError if the checkpoint id is already registered."""
        if checkpoint.checkpoint_id in self._registered:
            raise ValueError(f"checkpoint {checkpoint.checkpoint_id} is already registered")
        paths = checkpoint.referenced_paths()
        self._registered[checkpoint.checkpoint_id] = paths
        for p in paths:
            self._counts[p] = self._counts.get(p, 0) + 1

    def unregister(self, checkpoint: CompletedCheckpoint | int) -> list[str]:
        """Release a registered checkpoint (record or id); returns, sorted, the paths
        whose count dropped to zero (now deletable). Raises KeyError if not registered."""
        cid = checkpoint if isinstance(checkpoint, int) else checkpoint.checkpoint_id
        paths = self._registered.pop(cid)
        dropped = []
        for p in paths:
            n = self._counts[p] - 1
            if n == 0:
                del self._counts[p]
                dropped.append(p)
            else:
                self._counts[p] = n
        return sorted(dropped)

    def count(self, path: str) -> int:
        """How many registered checkpoints reference ``path`` (0 if none)."""
        return self._counts.get(path, 0)

    def counts(self) -> dict[str, int]:
        """A copy of every non-zero count."""
        return dict(self._counts)

    def referenced(self) -> frozenset[str]:
        """Every path referenced by at least one registered checkpoint."""
        return frozenset(self._counts)

    def registered_ids(self) -> list[int]:
        """Ids of the registered checkpoints, ascending."""
        return sorted(self._registered)
