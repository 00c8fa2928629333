"""Where the designs write: a fresh base path per design, optional fault injection
(``--dfs-faults``, through the ``faulty::`` protocol so node processes get it from their
topology's storage options) and the local S3 server (``--s3-local``, moto).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from dstltree.storage.faults import FaultSpec
from dstltree.storage.targets import LocalS3
from dstltree.storage.targets import start_local_s3 as _start_local_s3

__all__ = ["BenchStorage", "LocalS3", "start_local_s3"]

S3_BUCKET = "bench"


def start_local_s3() -> LocalS3:
    """The local moto S3 server of ``sparkplug.storage_target`` with bucket ``bench``."""
    return _start_local_s3(S3_BUCKET)


@dataclass
class BenchStorage:
    """The storage of one bench run. ``base_path`` None: a temporary local directory,
    deleted per design after its run. ``faults``: a FaultSpec applied to every request of
    every design (each process gets its own seed, derived from the spec's)."""

    base_path: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    faults: FaultSpec | None = None
    s3: LocalS3 | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    _tmp: str | None = None

    def __post_init__(self) -> None:
        if self.s3 is not None:
            self.base_path = f"s3://{self.s3.bucket}"
            self.storage_options = {**self.s3.storage_options, **self.storage_options}
        elif self.base_path is None:
            self._tmp = tempfile.mkdtemp(prefix="dstl-bench-")

    @property
    def describe(self) -> str:
        where = "moto S3" if self.s3 else (self.base_path or "local temp dir")
        return where + (f" + faults {self.faults}" if self.faults else "")

    def design_base(self, design: str) -> str:
        """The fresh base URL of ``design`` (without any ``faulty::`` prefix)."""
        if self._tmp is not None:
            return os.path.join(self._tmp, design)
        assert self.base_path is not None
        return f"{self.base_path.rstrip('/')}/bench-{self.run_id}-{design}"

    def url(self, base: str) -> str:
        """``base`` as the URL a process opens (``faulty::`` chained when faults are on)."""
        if self.faults is None:
            return base
        return "faulty::" + (base if "://" in base else f"file://{base}")

    def options(self, seed_offset: int) -> dict[str, Any]:
        """Storage options of one process; with faults, a per-process seed."""
        opts = copy.deepcopy(self.storage_options)
        if self.faults is None:
            return opts
        spec = replace(self.faults, seed=self.faults.seed + seed_offset)
        inner_protocol = (
            self.design_base("x").split("://")[0]
            if self.s3 or (self.base_path and "://" in self.base_path)
            else "file"
        )
        out: dict[str, Any] = {"faulty": {"spec": str(spec)}}
        if opts:
            out[inner_protocol] = opts
        return out

    def cleanup(self, design: str) -> None:
        """Delete a temporary design directory (local temp runs only)."""
        if self._tmp is not None:
            shutil.rmtree(os.path.join(self._tmp, design), ignore_errors=True)

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if self.s3 is not None:
            self.s3.stop()
