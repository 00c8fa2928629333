"""Where the job's DFS is: a base path plus fsspec storage options, optionally behind
the fault-injecting filesystem (``--dfs-faults``) or on a local S3 server
(``--s3-local``, moto's ThreadedMotoServer on a free loopback port)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from fsspec.core import split_protocol

LOCAL_S3_BUCKET = "dstl-demo"


def with_faults(
    base_path: str, storage_options: dict[str, Any], spec: str
) -> tuple[str, dict[str, Any]]:
    """The same storage behind ``faulty::`` with fault spec ``spec`` (validated here:
    raises ValueError naming a bad key). Every process that opens the returned URL
    (tasks, nodes, coordinator) injects the same kind of faults."""
    from dstltree.storage.faults import FaultSpec

    FaultSpec.parse(spec)
    protocol, path = split_protocol(base_path)
    if protocol is None or protocol == "file":
        protocol, path = "file", os.path.abspath(path)
    inner = f"{protocol}://{path}"
    return f"faulty::{inner}", {"faulty": {"spec": spec}, protocol: dict(storage_options)}


@dataclass
class LocalS3:
    """A moto S3 server on 127.0.0.1 with one bucket: ``endpoint`` (http URL) and the
    s3fs ``storage_options`` to reach it (dummy credentials). ``stop()`` ends it."""

    endpoint: str
    bucket: str
    server: Any = field(repr=False)
    storage_options: dict[str, Any] = field(default_factory=dict)

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def stop(self) -> None:
        self.server.stop()


_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_CONFIG_FILE": os.devnull,
}


def s3_storage_options(
    endpoint: str, key: str, secret: str, region: str = "us-east-1"
) -> dict[str, Any]:
    """s3fs options for an S3-compatible server at ``endpoint`` (http URL); retries are
    left to storage.store (ObjectStore), and a dead endpoint fails fast."""
    return {
        "endpoint_url": endpoint,
        "key": key,
        "secret": secret,
        "client_kwargs": {"region_name": region},
        "use_listings_cache": False,
        "skip_instance_cache": True,
        "config_kwargs": {
            "retries": {"max_attempts": 1, "mode": "standard"},
            "connect_timeout": 5,
            "read_timeout": 30,
        },
    }


def start_local_s3(bucket: str = LOCAL_S3_BUCKET, atomic: bool = False) -> LocalS3:
    """Start moto's S3 server on a free loopback port and create ``bucket``. Sets dummy
    AWS credentials (no instance metadata, no credential files, no proxy for loopback)
    in this process's environment, inherited by the processes it starts. ``atomic``:
    mutating requests serialized, so a conditional create is atomic
    (:mod:`dstltree.storage.atomic_moto`; moto's own is not)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per S3 request
    os.environ.update(_DUMMY_AWS_ENV)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(var, None)
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY"), "127.0.0.1,localhost") if p)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = no_proxy
    if atomic:
        from dstltree.storage.atomic_moto import AtomicMotoServer

        server: ThreadedMotoServer = AtomicMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    else:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    options = s3_storage_options(endpoint, "testing", "testing")
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    return LocalS3(endpoint, bucket, server, options)
