"""A fault-injecting in-memory filesystem of its own, and stores on it, for tests of
the upload path (hedging, object writer)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import fsspec

from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.store import ObjectStore, RetryPolicy


@contextmanager
def faulty_memory(spec: str = "none,stall_s=600") -> Iterator[FaultyFileSystem]:
    """A fresh in-memory fs wrapped by the fault injector with ``spec``; every stall
    still pending is released on exit."""
    inner = fsspec.filesystem("memory", skip_instance_cache=True)
    inner.store = {}
    inner.pseudo_dirs = [""]
    fs = FaultyFileSystem(inner, spec)
    try:
        yield fs
    finally:
        fs.release()


def memory_store(fs: FaultyFileSystem, retry: RetryPolicy, name: str = "s") -> ObjectStore:
    """A store under a fresh ``memory://<name>-<random>`` base path on ``fs``."""
    return ObjectStore(f"memory://{name}-{uuid.uuid4().hex[:8]}", fs=fs, retry=retry)
