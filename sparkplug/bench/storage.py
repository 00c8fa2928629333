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

from client.faults import FaultSpec

__all__ = ["BenchStorage", "LocalS3", "start_local_s3"]

S3_BUCKET = "bench"


@dataclass
class LocalS3:
    """A running moto ThreadedMotoServer on loopback: ``endpoint`` (http URL) and the s3fs
    ``storage_options`` to reach it."""

    endpoint: str
    storage_options: dict[str, Any]
    server: Any

    def stop(self) -> None:
        self.server.stop()


def start_local_s3() -> LocalS3:
    """Start moto's S3 server on a free 127.0.0.1 port with bucket ``bench``. Sets dummy
    AWS credentials (and no instance metadata, no credential files, no proxy for
    loopback) in ``os.environ`` so that child processes inherit them."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per S3 request

    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
    }
    os.environ.update(env)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(var, None)
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY"), "127.0.0.1,localhost") if p)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = no_proxy
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    opts: dict[str, Any] = {
        "endpoint_url": endpoint,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
        "use_listings_cache": False,
        "skip_instance_cache": True,
        "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"},
                          "connect_timeout": 5, "read_timeout": 30},
    }  # fmt: skip
    import boto3

    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket=S3_BUCKET)  # fmt: skip
    return LocalS3(endpoint, opts, server)


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
            self.base_path = f"s3://{S3_BUCKET}"
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
        inner_protocol = self.design_base("x").split("://")[0] if self.s3 or (
            self.base_path and "://" in self.base_path) else "file"  # fmt: skip
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
