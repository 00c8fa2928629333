"""Pre-created object files: a local store's per-object bookkeeping off the write path.

Creating a file and making its name durable (an fsync of its directory) costs about as
much as writing and fsyncing a small object's bytes. A local :class:`ObjectStore` with
``reserve_objects > 0`` creates the files of the names
:meth:`~dstltree.storage.store.ObjectStore.new_object_path` hands out ahead of time, on
a background thread, in batches whose names share one directory (a local filesystem
gains nothing from prefixes) so that one directory fsync makes a batch durable; ``put``
then writes into the existing empty file and fsyncs it: one fsync on the write path
instead of a file's and its directory's, and no rename. On a journaling filesystem
(ext4, XFS) every directory fsync commits the journal, and a write's fsync waiting
behind that commit is the latency a batch per directory keeps rare. Databases recycle
or pre-allocate their log files for the same reason (RocksDB's
``recycle_log_file_num``, PostgreSQL's WAL segments).

Reserved files are empty until written, under their final names. Nothing references a
name before its ``put`` returned, so a reader never meets one. Their modification time
is set :data:`FUTURE_S` seconds ahead, so that an in-run orphan sweep (which deletes
unreferenced files older than a cutoff) never deletes a name that a writer is about to
fill; writing sets the time to the present. A reservation older than :data:`MAX_AGE_S`
is unlinked instead of handed out. A write that finds its file gone (the final sweep of
a finished run deletes every unreferenced file) falls back to a temporary file and a
rename. Files reserved by a process that crashed are orphans like its temporary files;
the sweep of a finished run, or the start-up cleanup an hour later, deletes them.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
import time
from collections import deque
from collections.abc import Callable

#: seconds a reserved file's modification time lies ahead of its creation
FUTURE_S = 3600.0
#: seconds after which an unused reservation is dropped (far below FUTURE_S)
MAX_AGE_S = 600.0
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


class ObjectReservations:
    """Up to ``target`` pre-created empty files named by ``new_names(n)`` (``n`` fresh
    local paths in one directory, which ``ensure_dir`` creates durably), refilled on a
    daemon thread when half are taken. Thread-safe."""

    def __init__(
        self,
        new_names: Callable[[int], list[str]],
        ensure_dir: Callable[[str], None],
        fsync_dir: Callable[[str], None],
        target: int,
    ) -> None:
        if target < 1:
            raise ValueError(f"target must be >= 1, got {target}")
        self._new_names = new_names
        self._ensure_dir = ensure_dir
        self._fsync_dir = fsync_dir
        self.target = target
        self._cond = threading.Condition()
        self._pool: deque[tuple[str, float]] = deque()  # (path, created), oldest first
        self._handed: set[str] = set()  # taken, not yet claimed by a write
        self._thread: threading.Thread | None = None
        self._closed = False

    def take(self) -> str | None:
        """A reserved path, or None when none is ready (the caller names a file the
        usual way); wakes the refill thread when the pool runs low."""
        now = time.monotonic()
        stale: list[str] = []
        with self._cond:
            if self._closed:
                return None
            while self._pool and now - self._pool[0][1] > MAX_AGE_S:
                stale.append(self._pool.popleft()[0])
            path = self._pool.popleft()[0] if self._pool else None
            if path is not None:
                self._handed.add(path)
            if len(self._pool) <= self.target // 2:
                self._start_or_wake()
        _unlink(stale)
        return path

    def claim(self, path: str) -> bool:
        """Whether ``path`` is a reserved file handed out by :meth:`take` and not yet
        claimed; it is claimed (the caller writes into it) when True."""
        with self._cond:
            if path in self._handed:
                self._handed.discard(path)
                return True
            return False

    def close(self, timeout: float = 10.0) -> None:
        """Stop refilling and unlink the reservations never handed out (those handed
        out belong to their writers). Waits up to ``timeout`` seconds for a refill in
        progress, which unlinks what it made: once this returns, no reservation of
        this pool is left on disk (a listing right after a client closed saw files
        still being made)."""
        with self._cond:
            self._closed = True
            left = [p for p, _ in self._pool]
            self._pool.clear()
            self._cond.notify_all()
            thread = self._thread
        _unlink(left)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def ready(self) -> int:
        """Reservations ready to be taken (tests, statistics)."""
        with self._cond:
            return len(self._pool)

    # -- the refill thread ---------------------------------------------------------------
    def _start_or_wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reserve-objects", daemon=True)
            self._thread.start()
        else:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._pool) > self.target // 2:
                    self._cond.wait()
                if self._closed:
                    return
                want = self.target - len(self._pool)
            made = self._create(want)
            with self._cond:
                if self._closed:
                    _unlink(made)
                    return
                created = time.monotonic()
                self._pool.extend((p, created) for p in made)
                if not made:  # the filesystem refused: try again later, not in a loop
                    self._cond.wait(1.0)

    def _create(self, n: int) -> list[str]:
        """Create ``n`` empty files, set their times ahead, fsync their directory
        once; the paths made durable (none on an error, which is left to the
        ordinary write path)."""
        made: list[str] = []
        try:
            names = self._new_names(n)
            for parent in {posixpath.dirname(p) for p in names}:
                self._ensure_dir(parent)
            for path in names:
                os.close(os.open(path, _FLAGS, 0o666))
                made.append(path)
                ahead = time.time() + FUTURE_S
                os.utime(path, (ahead, ahead))
            for parent in {posixpath.dirname(p) for p in made}:
                self._fsync_dir(parent)
        except OSError:
            _unlink(made)
            return []
        return made


def _unlink(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            os.unlink(p)
