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
    from client.faults import FaultSpec

    FaultSpec.parse(spec)
    protocol, path = split_protocol(base_path)
    if protocol is None or protocol == "file":
        protocol, path = "file", os.path.abspath(path)
    inner = f"{protocol}://{path}"
    return f"faulty::{inner}", {"faulty": {"spec": spec}, protocol: dict(storage_options)}


@dataclass
class LocalS3:
    """A moto S3 server on 127.0.0.1 with one bucket; stop() ends it."""

    endpoint: str
    bucket: str
    server: Any = field(repr=False)

    def storage_options(self) -> dict[str, Any]:
        """s3fs options for this server (dummy credentials, no instance metadata)."""
        return {
            "endpoint_url": self.endpoint,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
            "use_listings_cache": False,
            "skip_instance_cache": True,
            "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
        }

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def stop(self) -> None:
        self.server.stop()


def start_local_s3(bucket: str = LOCAL_S3_BUCKET) -> LocalS3:
    """Start moto's S3 server on a free loopback port and create ``bucket``. Sets
    dummy AWS credentials in this process's environment (inherited by the processes it
    starts) so that nothing looks for real credentials or instance metadata."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request access log

    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
    }.items():  # fmt: skip
        os.environ.setdefault(k, v)
    os.environ["NO_PROXY"] = ",".join(p for p in (os.environ.get("NO_PROXY"), "127.0.0.1") if p)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = LocalS3(f"http://{host}:{port}", bucket, server)
    import boto3

    boto3.client(
        "s3", endpoint_url=s3.endpoint, aws_access_key_id="testing",
        aws_secret_access_key="testing", region_name="us-east-1",
    ).create_bucket(Bucket=bucket)  # fmt: skip
    return s3
