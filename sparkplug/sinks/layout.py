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
- On S3 (sinks/multipart.py) a part file is staged as an open multipart upload at its
  final key instead: no object exists under that name (nor under ``_staging``) until
  the commit completes the upload, so readers of ``<url>`` again see final files only.
  The committable keeps a staged name all the same, as its identity; no file has it.
- Staged names carry a random id, never user input; a committable's paths, upload id
  and parts are checked (:meth:`Committable.validate`) before the committer touches
  anything (docs/design.md, "Nothing from the network is trusted").
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from dstltree.sparkplug.sinks.multipart import MAX_PART_BYTES, MAX_PARTS, MIN_PART_BYTES, UploadPart

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


def staged_name(
    checkpoint_id: int, task: int, attempt: int, ext: str, uid: str | None = None
) -> str:
    """A fresh staged file name (relative), unique by a random id (``uid``: the id of an
    existing name, to write it again)."""
    uid = uuid.uuid4().hex if uid is None else uid
    name = f"cp-{checkpoint_id:012d}-task-{task:05d}-{uid}.{ext}"
    return f"{attempt_dir(attempt)}/{name}"


def in_progress_name(task: int, attempt: int, ext: str) -> str:
    """A fresh name for the part file being written (local sinks write it in place)."""
    return f"{attempt_dir(attempt)}/inprogress-task-{task:05d}-{uuid.uuid4().hex}.{ext}"


def final_name(checkpoint_id: int, task: int, attempt: int, ext: str) -> str:
    """The visible name of (checkpoint, attempt, task)'s output (relative)."""
    return f"part-{checkpoint_id:012d}-{attempt:06d}-{task:05d}.{ext}"


def is_final_name(name: str) -> bool:
    """Whether a base name is a committed part file's."""
    return _FINAL.fullmatch(name) is not None


def staged_attempt(relative: str) -> int | None:
    """The attempt of a path below ``_staging`` (None if it is in no attempt folder)."""
    m = re.match(r"^_staging/attempt-(\d{6})/", relative)
    return int(m.group(1)) if m else None


def final_key(relative: str) -> tuple[int, int] | None:
    """(checkpoint id, attempt) of a final name (relative to the sink URL; None for any
    other path): where an open multipart upload of the sink belongs."""
    m = _FINAL.fullmatch(relative)
    return (int(m.group("cp")), int(m.group("attempt"))) if m else None


def staged_checkpoint(relative: str) -> int | None:
    """The checkpoint id of a staged file name (None for any other path)."""
    m = _STAGED.fullmatch(relative)
    return int(m.group("cp")) if m else None


def _check_int(name: str, value: Any, high: int, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise ValueError(f"committable field {name!r} out of range: {value!r}")
    return value


# What a store's multipart upload ids and part ETags may look like: bounded strings of
# characters that need no escaping in a URL query or an XML body (AWS: base64-like ids
# and quoted hex ETags; MinIO, moto alike). Matched whole (``fullmatch``: ``$`` would
# let a trailing newline through); an upload id holds no ``..`` either.
_UPLOAD_ID = re.compile(r"^[A-Za-z0-9._~+/=-]{1,1024}$")
_ETAG = re.compile(r'^[A-Za-z0-9"._:+/=-]{1,128}$')


def _wire_parts(raw: Any) -> tuple[UploadPart, ...]:
    """Decode the ``parts`` field (a list of ``[number, etag, size]``), refusing
    anything but a bounded list of that shape before looking inside."""
    if not isinstance(raw, list | tuple) or not 1 <= len(raw) <= MAX_PARTS:
        raise ValueError(f"committable field 'parts' must be 1..{MAX_PARTS} parts")
    parts = []
    for entry in raw:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise ValueError(f"committable part {entry!r:.80} is not [number, etag, size]")
        number, etag, size = entry
        if not isinstance(etag, str):
            raise ValueError(f"committable part etag {etag!r:.80} is not a string")
        parts.append(
            UploadPart(
                _check_int("part number", number, MAX_PARTS + 1, low=1),
                etag,
                _check_int("part size", size, MAX_PART_BYTES + 1),
            )
        )
    return tuple(parts)


@dataclass(frozen=True)
class Committable:
    """One task's staged output for one checkpoint, carried in the checkpoint
    acknowledgement and in the checkpoint's metadata: ``staged`` and ``final`` are
    paths relative to the sink URL, ``rows`` the row count, ``bytes`` the part file's
    size in bytes.

    Two kinds (sinks/files.py says which store gets which):

    - staged file (``upload_id`` None, ``parts`` empty): the part file is an object or
      file at ``staged``; the commit renames it (local) or copies then deletes it.
    - multipart (S3): the part file's bytes are the ``parts`` of the open multipart
      upload ``upload_id`` at the FINAL key; the commit completes it. ``staged`` names
      no object then: it stays the committable's identity (the layout's staged name,
      random id included), which retained sets and logs use. Every part is an
      :class:`UploadPart` ``(number, etag, size)``: numbers 1..n in order, every size
      but the last at least 5 MiB, at most 5 GiB each, the sizes adding up to
      ``bytes``.

    Encode with :meth:`to_wire` (a msgpack- and JSON-encodable dict; a staged-file
    committable encodes exactly as before the multipart fields existed), decode with
    :meth:`from_wire`."""

    checkpoint_id: int
    task: int
    attempt: int
    staged: str
    final: str
    rows: int
    bytes: int
    upload_id: str | None = None
    parts: tuple[UploadPart, ...] = ()

    @property
    def multipart(self) -> bool:
        """Whether the commit completes a multipart upload (else it moves a file)."""
        return self.upload_id is not None

    def to_wire(self) -> dict[str, Any]:
        """A dict of ints, strings and (for multipart) ``upload_id`` plus ``parts`` as
        a list of ``[number, etag, size]`` lists."""
        d: dict[str, Any] = {
            "checkpoint_id": self.checkpoint_id,
            "task": self.task,
            "attempt": self.attempt,
            "staged": self.staged,
            "final": self.final,
            "rows": self.rows,
            "bytes": self.bytes,
        }
        if self.upload_id is not None:
            d["upload_id"] = self.upload_id
            d["parts"] = [[p.number, p.etag, p.size] for p in self.parts]
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Committable:
        """Decode and validate (see :meth:`validate`); ``upload_id`` and ``parts`` are
        optional (absent: a staged-file committable, as every earlier version wrote).
        Raises ValueError for anything else, a value out of range, or a wrong shape."""
        if not isinstance(d, dict):
            raise ValueError(f"a committable is a dict, got {type(d).__name__}")
        upload_id = d.get("upload_id")
        raw_parts = d.get("parts")
        if upload_id is not None and not isinstance(upload_id, str):
            raise ValueError(f"committable field 'upload_id' is not a string: {upload_id!r:.80}")
        if (upload_id is None) != (raw_parts is None):
            raise ValueError("committable fields 'upload_id' and 'parts' come together")
        staged, final = d.get("staged"), d.get("final")
        if not isinstance(staged, str) or not isinstance(final, str):
            raise ValueError("committable fields 'staged' and 'final' must be strings")
        c = cls(
            checkpoint_id=_check_int("checkpoint_id", d.get("checkpoint_id"), 10**12),
            task=_check_int("task", d.get("task"), 10**5),
            attempt=_check_int("attempt", d.get("attempt"), 10**6),
            staged=staged,
            final=final,
            rows=_check_int("rows", d.get("rows"), 2**63),
            bytes=_check_int("bytes", d.get("bytes"), 2**63),
            upload_id=upload_id,
            parts=() if raw_parts is None else _wire_parts(raw_parts),
        )
        c.validate()
        return c

    def validate(self) -> None:
        """Raise ValueError unless ``staged`` and ``final`` are the layout's names for
        this (checkpoint, attempt, task), and, for a multipart committable, the upload
        id is a bounded string of safe characters and the parts are 1..10,000 parts
        numbered 1..n with bounded ETags and sizes S3 accepts that add up to
        ``bytes``. A staged-file committable has no parts."""
        m = _STAGED.fullmatch(self.staged)
        if m is None:
            raise ValueError(f"not a staged file of this sink: {self.staged!r:.200}")
        key = (int(m.group("cp")), int(m.group("attempt")), int(m.group("task")))
        if key != (self.checkpoint_id, self.attempt, self.task):
            raise ValueError(
                f"staged file {self.staged!r} is not of checkpoint {self.checkpoint_id}, "
                f"attempt {self.attempt}, task {self.task}"
            )
        expected = final_name(self.checkpoint_id, self.task, self.attempt, m.group("ext"))
        if self.final != expected:
            raise ValueError(f"final name {self.final!r:.200} should be {expected!r}")
        if self.upload_id is None:
            if self.parts:
                raise ValueError(f"{self.staged}: parts without an upload id")
            return
        self._validate_upload()

    def _validate_upload(self) -> None:
        uid = self.upload_id
        if not isinstance(uid, str) or not _UPLOAD_ID.fullmatch(uid) or ".." in uid:
            raise ValueError(f"{self.staged}: bad upload id {self.upload_id!r:.80}")
        n = len(self.parts)
        if not 1 <= n <= MAX_PARTS:
            raise ValueError(f"{self.staged}: {n} parts, S3 takes 1..{MAX_PARTS}")
        total = 0
        for i, part in enumerate(self.parts, start=1):
            if not isinstance(part, UploadPart):
                raise ValueError(f"{self.staged}: part {i} is not an UploadPart")
            number, etag, size = part
            if not isinstance(number, int) or isinstance(number, bool) or number != i:
                raise ValueError(f"{self.staged}: part {i} is numbered {number!r:.20}")
            if not isinstance(etag, str) or not _ETAG.fullmatch(etag):
                raise ValueError(f"{self.staged}: part {i} has a bad ETag {etag!r:.80}")
            low = 0 if n == 1 else (1 if i == n else MIN_PART_BYTES)
            _check_int(f"part {i} size", size, MAX_PART_BYTES + 1, low=low)
            total += size
        if total != self.bytes:
            raise ValueError(f"{self.staged}: parts hold {total} bytes, the file {self.bytes}")
