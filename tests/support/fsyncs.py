"""Recording the paths a test's code fsyncs."""

from __future__ import annotations

import os

import pytest


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make ``os.fsync`` also append the path of each fsynced descriptor (files and
    directories, in order) to the returned list, for the rest of the test."""
    synced: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return synced
