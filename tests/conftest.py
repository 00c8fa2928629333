"""Shared fixtures of every test folder.

- ``s3_server`` / ``s3``: a moto S3 server on a free loopback port (module scope) and a
  fresh bucket prefix on it; ``minio_server`` / ``s3_any``: the same on MinIO through
  testcontainers, skipped with the reason where no Docker engine answers
  (tests/support/s3_server.py).
- ``tree``: helpers in tests/support/tree_fixtures.py start real node processes.

Folders: ``unit/`` (pure code, no sockets or processes), ``integration/`` (real nodes
over loopback, real S3 servers, the CLI), ``e2e/`` (the main job on Spark).
"""

from tests.support.s3_server import (  # noqa: F401  (fixtures are found by name)
    minio_server_fixture,
    s3_any_fixture,
    s3_fixture,
    s3_server_fixture,
)
