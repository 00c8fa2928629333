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
    """A checkpoint metadata file or the ``LATEST`` pointer cannot be decoded."""


class CoordinatorError(DstlError):
    """The coordinator is not running, was stopped, or did not answer in time."""
