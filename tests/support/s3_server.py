"""Fixtures: a real S3 protocol endpoint on loopback for the storage tests.

- ``s3_server`` (module scope): moto's ``ThreadedMotoServer`` on a free 127.0.0.1 port
  (the pattern of s3fs's own test suite). Dummy credentials only; boto is kept from
  looking for instance metadata or credential files.
- ``s3`` (function scope): resets the moto state (``POST /moto-api/reset``), creates
  the bucket ``dstl-test`` and yields an :class:`S3Target` with ``base_url``
  (``s3://dstl-test``) and the s3fs ``storage_options`` (endpoint_url, key, secret).
- ``s3_any``: the same, parametrized over ``moto`` and ``minio``; the MinIO variant
  starts a container through testcontainers and is skipped, with the reason, when no
  Docker engine answers (checked once, with a 3 s timeout).

The fixtures are registered for every test by tests/conftest.py.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from dstltree.storage.targets import s3_storage_options
from tests.support.waiting import wait_until

BUCKET = "dstl-test"
_KEY = "testing"
_SECRET = "testing"
_REGION = "us-east-1"
_MINIO_IMAGE = "minio/minio:RELEASE.2024-10-13T13-34-11Z"


@dataclass(frozen=True)
class S3Target:
    """One S3 endpoint with a fresh bucket: ``base_url`` is ``s3://<bucket>``,
    ``storage_options`` the s3fs options to reach it, ``endpoint`` its http URL."""

    kind: str
    endpoint: str
    base_url: str
    storage_options: dict[str, Any] = field(hash=False)

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as ``(base_url, storage_options)``."""
        return iter((self.base_url, self.storage_options))


def _isolated_env(mp: pytest.MonkeyPatch) -> None:
    """Dummy credentials, no IMDS, no credential/config files, no proxy for loopback."""
    mp.setenv("AWS_ACCESS_KEY_ID", _KEY)
    mp.setenv("AWS_SECRET_ACCESS_KEY", _SECRET)
    mp.setenv("AWS_DEFAULT_REGION", _REGION)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    mp.setenv("AWS_CONFIG_FILE", os.devnull)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        mp.delenv(var, raising=False)
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY"), "127.0.0.1,localhost") if p)
    mp.setenv("NO_PROXY", no_proxy)
    mp.setenv("no_proxy", no_proxy)


def _storage_options(endpoint: str, key: str, secret: str) -> dict[str, Any]:
    return s3_storage_options(endpoint, key, secret, _REGION)


def _post(url: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(urllib.request.Request(url, method="POST"), timeout=10) as r:
        r.read()


def _new_bucket(kind: str, endpoint: str, key: str, secret: str) -> S3Target:
    import boto3
    import s3fs

    opts = _storage_options(endpoint, key, secret)
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=_REGION,
    )
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        fs = s3fs.S3FileSystem(**opts)
        leftovers = fs.find(BUCKET)
        if leftovers:
            fs.rm(leftovers)
    return S3Target(kind, endpoint, f"s3://{BUCKET}", opts)


@pytest.fixture(scope="module", name="s3_server")
def s3_server_fixture() -> Iterator[str]:
    """moto's S3 server on a free loopback port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        _isolated_env(mp)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture(name="s3")
def s3_fixture(s3_server: str) -> Iterator[S3Target]:
    """A fresh bucket on the module's moto server (state reset before the test)."""
    with pytest.MonkeyPatch.context() as mp:
        _isolated_env(mp)
        _post(f"{s3_server}/moto-api/reset")
        yield _new_bucket("moto", s3_server, _KEY, _SECRET)


_docker_reason: list[str | None] = []


def docker_unavailable() -> str | None:
    """Why no Docker engine can be used (None if one answers). Checked once."""
    if not _docker_reason:
        try:
            import docker

            docker.from_env(timeout=3).ping()
            _docker_reason.append(None)
        except Exception as e:  # noqa: BLE001 - any failure means "no engine"
            _docker_reason.append(f"no Docker engine answers ({type(e).__name__}: {e})")
    return _docker_reason[0]


@pytest.fixture(scope="module", name="minio_server")
def minio_server_fixture() -> Iterator[tuple[str, str, str]]:
    """A MinIO container (testcontainers); yields (endpoint, key, secret). Skipped when
    no Docker engine answers."""
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"MinIO tests skipped: {reason}")
    from testcontainers.core.container import DockerContainer

    key, secret = "minioadmin", "minioadmin-secret"
    container = (
        DockerContainer(_MINIO_IMAGE)
        .with_command("server /data")
        .with_env("MINIO_ROOT_USER", key)
        .with_env("MINIO_ROOT_PASSWORD", secret)
        .with_exposed_ports(9000)
    )
    with container:
        endpoint = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(9000)}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def live() -> bool:
            try:
                with opener.open(f"{endpoint}/minio/health/live", timeout=2):
                    return True
            except OSError:
                return False

        wait_until(live, timeout=60, interval=0.5)
        yield endpoint, key, secret


@pytest.fixture(params=["moto", "minio"], name="s3_any")
def s3_any_fixture(request: pytest.FixtureRequest) -> Iterator[S3Target]:
    """A fresh bucket on moto, then on MinIO (skipped without Docker)."""
    if request.param == "moto":
        yield request.getfixturevalue("s3")
        return
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"MinIO tests skipped: {reason}")
    endpoint, key, secret = request.getfixturevalue("minio_server")
    with pytest.MonkeyPatch.context() as mp:
        _isolated_env(mp)
        yield _new_bucket("minio", endpoint, key, secret)
