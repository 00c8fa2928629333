"""Where a file sink's files live under its URL, and the committable that names them.

Layout of a sink URL (``<url>``), one job per URL::

    <url>/part-<checkpoint:012d>-<attempt:06d>-<task:05d>.<ext>       final, visible
    <url>/_staging/attempt-<attempt:06d>/cp-<checkpoint:012d>-task-<task:05d>-<uuid>.<ext>
    <url>/_staging/attempt-<attempt:06d>/inprogress-task-<task:05d>-<uuid>.<ext>  (local)

- Final names are derived only from (checkpoint id, attempt, task): committing the same
  committable twice writes the same name (idempotent), and zero-padded fields make the
  names sort in commit order (checkpoint ids grow within an attempt; a restored attempt
  continues after the checkpoint it restored, so only one attempt ever completes a
  given checkpoint id). The attempt keeps names of different attempts apart even though
  checkpoint ids are reused after a restore (coordinator/state.py numbers on from the
  restored checkpoint).
- Staged and in-progress files sit below ``_staging``: Spark/Hadoop and
  ``pyarrow.dataset`` skip every path component starting with ``_`` or ``.``, so
  readers of ``<url>`` see final files only.
- Staged names carry a random id, never user input; a committable's paths are checked
  against these patterns before the committer touches them (docs/design.md, "Nothing
  from the network is trusted").
"""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass
from typing import Any

STAGING_DIR = "_staging"
EXTENSIONS = {"parquet": "parquet", "csv": "csv", "json": "json"}

_STAGED = re.compile(
    r"^_staging/attempt-(?P<attempt>\d{6})/cp-(?P<cp>\d{12})-task-(?P<task>\d{5})-[0-9a-f]{32}"
    r"\.(?P<ext>parquet|csv|json)$"
)
_FINAL = re.compile(
    r"^part-(?P<cp>\d{12})-(?P<attempt>\d{6})-(?P<task>\d{5})\.(?:parquet|csv|json)$"
)


def attempt_dir(attempt: int) -> str:
    """The staging folder of one attempt, relative to the sink URL."""
    return f"{STAGING_DIR}/attempt-{attempt:06d}"


def staged_name(checkpoint_id: int, task: int, attempt: int, ext: str) -> str:
    """A fresh staged file name (relative), unique by a random id."""
    name = f"cp-{checkpoint_id:012d}-task-{task:05d}-{uuid.uuid4().hex}.{ext}"
    return f"{attempt_dir(attempt)}/{name}"


def in_progress_name(task: int, attempt: int, ext: str) -> str:
    """A fresh name for the part file being written (local sinks write it in place)."""
    return f"{attempt_dir(attempt)}/inprogress-task-{task:05d}-{uuid.uuid4().hex}.{ext}"


def final_name(checkpoint_id: int, task: int, attempt: int, ext: str) -> str:
    """The visible name of (checkpoint, attempt, task)'s output (relative)."""
    return f"part-{checkpoint_id:012d}-{attempt:06d}-{task:05d}.{ext}"


def is_final_name(name: str) -> bool:
    """Whether a base name is a committed part file's."""
    return _FINAL.match(name) is not None


def staged_attempt(relative: str) -> int | None:
    """The attempt of a path below ``_staging`` (None if it is in no attempt folder)."""
    m = re.match(r"^_staging/attempt-(\d{6})/", relative)
    return int(m.group(1)) if m else None


def staged_checkpoint(relative: str) -> int | None:
    """The checkpoint id of a staged file name (None for any other path)."""
    m = _STAGED.match(relative)
    return int(m.group("cp")) if m else None


def _check_int(name: str, value: Any, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < high:
        raise ValueError(f"committable field {name!r} out of range: {value!r}")
    return value


@dataclass(frozen=True)
class Committable:
    """One task's staged output for one checkpoint, carried in the checkpoint
    acknowledgement: ``staged`` and ``final`` are paths relative to the sink URL,
    ``rows`` the row count, ``bytes`` the staged file's size. Encode with
    :meth:`to_wire` (a msgpack-encodable dict), decode with :meth:`from_wire`."""

    checkpoint_id: int
    task: int
    attempt: int
    staged: str
    final: str
    rows: int
    bytes: int

    def to_wire(self) -> dict[str, int | str]:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Committable:
        """Decode and validate: the paths must be this layout's staged and final names
        of the same (checkpoint, attempt, task). Raises ValueError otherwise."""
        c = cls(
            checkpoint_id=_check_int("checkpoint_id", d.get("checkpoint_id"), 10**12),
            task=_check_int("task", d.get("task"), 10**5),
            attempt=_check_int("attempt", d.get("attempt"), 10**6),
            staged=str(d.get("staged")),
            final=str(d.get("final")),
            rows=_check_int("rows", d.get("rows"), 2**63),
            bytes=_check_int("bytes", d.get("bytes"), 2**63),
        )
        c.validate()
        return c

    def validate(self) -> None:
        """Raise ValueError unless ``staged`` and ``final`` are the layout's names for
        this (checkpoint, attempt, task)."""
        m = _STAGED.match(self.staged)
        if m is None:
            raise ValueError(f"not a staged file of this sink: {self.staged!r}")
        key = (int(m.group("cp")), int(m.group("attempt")), int(m.group("task")))
        if key != (self.checkpoint_id, self.attempt, self.task):
            raise ValueError(f"staged file {self.staged!r} is not of {self}")
        expected = final_name(self.checkpoint_id, self.task, self.attempt, m.group("ext"))
        if self.final != expected:
            raise ValueError(f"final name {self.final!r} should be {expected!r}")
