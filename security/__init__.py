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
``writer.key_secret``), see :func:`load_key_dir`. :func:`configure_server` and
:func:`configure_client` set a socket up before bind/connect; ``None`` means plaintext.
"""

from dstltree.security.curve import (
    Curve,
    auth_refusals,
    configure_client,
    configure_server,
    register_refusal_metrics,
    stop_authenticator,
)
from dstltree.security.keys import (
    ClusterKeys,
    KeyDirError,
    Keypair,
    generate_key_dir,
    job_keys,
    key_files,
    load_key_dir,
    write_key_files,
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
    "Keypair",
    "SecuritySettings",
    "auth_refusals",
    "cluster_keys_for_nodes",
    "configure_client",
    "configure_server",
    "generate_key_dir",
    "job_keys",
    "key_files",
    "load_key_dir",
    "register_refusal_metrics",
    "stop_authenticator",
    "write_key_files",
]
