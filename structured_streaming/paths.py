"""What each file of a Structured Streaming checkpoint location is, and so when the
bridge makes it durable (pure; docs/structured-streaming.md, "Durability").

A path is relative to the query root (the checkpoint location). Spark writes, per
micro-batch N: the sources' logs (``sources/<i>/<N>``, the file source's), the
offsets log entry (``offsets/<N>``: batch N is planned), the state files of each
stateful operator (``state/<op>/<partition>/...``) and the commit log entry
(``commits/<N>``: batch N is done). Once per query it writes ``metadata`` (the query
id) and the operators' metadata and schema files (``state/<op>/_metadata/...``,
``state/<op>/<partition>/_metadata/schema``, ``state/<op>/_stateSchema/...``).

Kinds:

- ``STATE``: a state file. Held for the root's commit when the driver commits on this
  bridge (or on another host's that asked for it), else persisted at once.
- ``LOG``: a source's log entry or the query's ``metadata``: held like a state file;
  the next ``offsets/<N>`` makes it durable with itself (one object). Spark's
  ``HDFSMetadataLog`` only needs an entry durable before the batch that reads it
  runs, and a batch runs only after its ``offsets/<N>`` is durable.
- ``OFFSETS``: ``offsets/<N>``: it and every write of the root held on this bridge
  are persisted as one flush, and the write returns once all are durable.
- ``COMMIT``: ``commits/<N>``, sent with the commit request itself: persisted in the
  same flush group as the batch's state files.
- ``META``: anything else (operator metadata, schemas, files the bridge does not
  know): persisted at once, the write returns once it is durable.
"""

from __future__ import annotations

import re
from typing import Final

STATE: Final = "state"
LOG: Final = "log"
OFFSETS: Final = "offsets"
COMMIT: Final = "commit"
META: Final = "meta"

_STATE = re.compile(r"^state/\d+/\d+/(?!_)[^/]+(?:/(?!_)[^/]+)*$")
_LOG = re.compile(r"^(?:sources/\d+/\d+(?:\.compact)?|metadata)$")
_OFFSETS = re.compile(r"^offsets/\d+$")
_COMMIT = re.compile(r"^commits/\d+$")


def kind(path: str) -> str:
    """The kind of a file (module docstring) from its path below the query root."""
    if _STATE.match(path):
        return STATE
    if _OFFSETS.match(path):
        return OFFSETS
    if _COMMIT.match(path):
        return COMMIT
    if _LOG.match(path):
        return LOG
    return META


def holdable(path: str) -> bool:
    """Whether a write of ``path`` may wait in memory for a later flush (a state file
    or a log entry); the others are durable before the write returns."""
    return kind(path) in (STATE, LOG, OFFSETS, COMMIT)
