"""Authentication of every ZeroMQ socket of dstltree with CURVE (pyzmq ``zmq.auth``).

Three kinds of keys (z85-encoded, 40 bytes each, see :class:`Keypair`):

- the cluster's ``node`` keypair: every aggregator node serves with it and connects to
  its parent (and plan targets) with it;
- the cluster's ``writer`` keypair: the clients of the nodes (tasks' uploaders) connect
  with it; nodes accept ``node`` and ``writer`` public keys only;
- a per-job keypair made by the driver (:func:`job_keys`): the coordinator and every
  task's exchange serve with it, task links and exchange senders connect with it.

The cluster keys live in a key directory (``dstl keys generate DIR``, the files of
``zmq.auth.create_certificates``: ``node.key``, ``node.key_secret``, ``writer.key``,
``writer.key_secret``), see :func:`load_key_dir`; during a key rotation
(:mod:`dstltree.security.rotation`, ``dstl keys rotate``) nodes accept both
generations' keys and clients know both generations' node keys. :func:`configure_server`
and :func:`configure_client` set a socket up before bind/connect; ``None`` means
plaintext.
"""

from dstltree.security.curve import (
    Curve,
    auth_accepts,
    auth_refusals,
    configure_client,
    configure_server,
    register_refusal_metrics,
    server_keys_of,
    stop_authenticator,
)
from dstltree.security.keys import (
    ClusterKeys,
    KeyDirError,
    Keypair,
    Rotation,
    fingerprint,
    generate_key_dir,
    job_keys,
    key_files,
    load_key_dir,
    write_key_files,
)
from dstltree.security.rotation import (
    KeyDirStatus,
    RotationError,
    abort_rotation,
    finish_rotation,
    key_dir_status,
    promote_rotation,
    start_rotation,
)
from dstltree.security.settings import (
    KEYS_ENV,
    JobSecurity,
    SecuritySettings,
    cluster_keys_for_nodes,
)

__all__ = [
    "KEYS_ENV",
    "ClusterKeys",
    "Curve",
    "JobSecurity",
    "KeyDirError",
    "KeyDirStatus",
    "Keypair",
    "Rotation",
    "RotationError",
    "SecuritySettings",
    "abort_rotation",
    "auth_accepts",
    "auth_refusals",
    "cluster_keys_for_nodes",
    "configure_client",
    "configure_server",
    "finish_rotation",
    "fingerprint",
    "generate_key_dir",
    "job_keys",
    "key_dir_status",
    "key_files",
    "load_key_dir",
    "promote_rotation",
    "register_refusal_metrics",
    "server_keys_of",
    "start_rotation",
    "stop_authenticator",
    "write_key_files",
]
