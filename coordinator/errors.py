"""Errors of the coordinator. All derive from :class:`dstltree.client.errors.DstlError`."""

from __future__ import annotations

from dstltree.client.errors import DstlError


class CheckpointStoreError(DstlError):
    """The completed-checkpoint store on DFS is unusable; ``path`` names the file."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"checkpoint store {path}: {reason}")
        self.path = path
        self.reason = reason


class CorruptCheckpointError(CheckpointStoreError):
    """A commit record, checkpoint metadata, a split log or an old layout's pointer
    cannot be decoded, or names a format version this code does not know."""


class CoordinatorError(DstlError):
    """The coordinator is not running, was stopped, or did not answer in time."""
