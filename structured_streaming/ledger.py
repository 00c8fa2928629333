"""What a bridge tells ``dstl status`` about the queries it serves: per query root its
last batch, commits, durable files, objects per batch and held bytes, and per Spark
JVM the state files it wrote as plain files because no bridge answered.

Pure bookkeeping (no I/O, no threads): :class:`~.files.TreeFiles` calls it under its
lock and answers the bridge protocol's ``status`` request from :meth:`Ledger.figures`.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

BATCH_WINDOW = 100
"""Commits over which objects per batch is averaged."""

MAX_JVMS = 4096
"""Spark JVMs whose plain-file counts are kept (the oldest report is dropped first)."""

_COMMIT = re.compile(r"^commits/(\d{1,18})$")
_STATE_VERSION = re.compile(r"^state/.+/(\d{1,18})\.(?:delta|snapshot|changelog|zip)$")


def batch_of(path: str) -> int | None:
    """The batch a checkpoint file belongs to: ``commits/<N>`` is batch N, a state
    file ``state/<op>/<partition>/<V>.delta`` (``.snapshot``, ``.changelog``,
    ``.zip``) batch V - 1 (Spark's state store versions count from 1); None otherwise."""
    m = _COMMIT.match(path)
    if m is not None:
        return int(m.group(1))
    m = _STATE_VERSION.match(path)
    return int(m.group(1)) - 1 if m is not None else None


@dataclass
class QueryLedger:
    """One query root's figures. Times are the caller's clock (seconds)."""

    last_batch: int | None = None
    commits: int = 0
    last_commit_at: float | None = None
    files_durable: int = 0
    apps: set[str] = field(default_factory=set)
    batch_objects: set[str] = field(default_factory=set)  # since the last commit
    objects_per_commit: deque[int] = field(default_factory=lambda: deque(maxlen=BATCH_WINDOW))


class Ledger:
    """Per query root and per JVM figures of one bridge."""

    def __init__(self) -> None:
        self.queries: dict[str, QueryLedger] = {}
        self.plain: dict[tuple[str, str], int] = {}  # (app, jvm) -> plain state files

    def _q(self, root: str) -> QueryLedger:
        return self.queries.setdefault(root, QueryLedger())

    def on_write(self, root: str, path: str, app: str) -> None:
        """``app`` wrote ``path`` of ``root`` (accepted, not yet durable)."""
        q = self._q(root)
        if app:
            q.apps.add(app)
        b = batch_of(path)
        if b is not None and (q.last_batch is None or b > q.last_batch):
            q.last_batch = b

    def on_durable(self, root: str, object_url: str) -> None:
        """A file of ``root`` became durable in ``object_url``."""
        q = self._q(root)
        q.files_durable += 1
        q.batch_objects.add(object_url)

    def on_commit(self, root: str, now: float) -> None:
        """The driver committed ``root``'s batch at ``now``: the objects written since
        the previous commit count for this batch."""
        q = self._q(root)
        q.commits += 1
        q.last_commit_at = now
        q.objects_per_commit.append(len(q.batch_objects))
        q.batch_objects.clear()

    def on_plain_report(self, app: str, jvm: str, plain: int) -> None:
        """A JVM of ``app`` says it wrote ``plain`` state files as plain files so far
        (its hello): kept as the largest report of that JVM."""
        key = (app, jvm)
        if key not in self.plain and len(self.plain) >= MAX_JVMS:
            del self.plain[next(iter(self.plain))]
        self.plain[key] = max(plain, self.plain.get(key, 0))

    def figures(self, now: float, held: dict[str, int]) -> list[dict[str, Any]]:
        """One JSON object per query root, sorted by root: ``root``, ``last_batch``
        (None before the first), ``commits``, ``last_commit_age`` (seconds, None before
        the first commit), ``files_durable``, ``objects_per_batch`` (mean over the last
        :data:`BATCH_WINDOW` commits, None before the first), ``held_bytes`` (from
        ``held``: root -> bytes) and ``plain_files`` (the plain-file reports of the
        JVMs of the applications that wrote to it)."""
        out = []
        for root in sorted(set(self.queries) | set(held)):
            q = self.queries.get(root, QueryLedger())
            per = list(q.objects_per_commit)
            age = None if q.last_commit_at is None else max(0.0, now - q.last_commit_at)
            plain = sum(n for (app, _), n in self.plain.items() if app in q.apps)
            out.append(
                {
                    "root": root,
                    "last_batch": q.last_batch,
                    "commits": q.commits,
                    "last_commit_age": age,
                    "files_durable": q.files_durable,
                    "objects_per_batch": sum(per) / len(per) if per else None,
                    "held_bytes": held.get(root, 0),
                    "plain_files": plain,
                    "apps": sorted(q.apps),
                }
            )
        return out

    def validate(self) -> None:
        """Invariants: counts are non-negative, the window is bounded, the JVM map too."""
        assert len(self.plain) <= MAX_JVMS
        for q in self.queries.values():
            assert q.commits >= 0 and q.files_durable >= 0
            assert len(q.objects_per_commit) <= BATCH_WINDOW
            assert all(n >= 0 for n in self.plain.values())
