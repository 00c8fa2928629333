"""The topology's ``security`` field and what the driver ships to its tasks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from dstltree.security.curve import Curve
from dstltree.security.keys import ClusterKeys, KeyDirError, job_keys, load_key_dir

KEYS_ENV = "DSTL_KEYS"
"""Environment variable naming the key directory of a node process (set by the
launchers for nodes whose topology names none; never a command-line argument)."""


class SecuritySettings(BaseModel):
    """The topology's ``security`` field::

        security:
          curve: true               # default; false = plaintext sockets (explicit only)
          keys: /etc/dstl/keys      # the cluster key directory (dstl keys generate DIR)
          metrics_host: 0.0.0.0     # what metrics endpoints bind (default: loopback)

    ``keys`` may be omitted where the driver or ``dstl up`` starts the nodes (it then
    generates the cluster keys); nodes started by hosts' supervisors need it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    curve: bool = True
    keys: str | None = Field(default=None, min_length=1, max_length=4096)
    metrics_host: str | None = Field(default=None, min_length=1, max_length=255)


def cluster_keys_for_nodes(
    settings: SecuritySettings, source: str, required: bool
) -> ClusterKeys | None:
    """The cluster keys named by ``$DSTL_KEYS`` (set by launchers and supervisors),
    else by ``settings.keys``; None when
    CURVE is off, or when no directory is named and ``required`` is False (the caller
    generates keys). Raises TopologyError naming ``security.keys`` when a directory is
    required but not named, or cannot be loaded."""
    from dstltree.topology.tree import TopologyError

    if not settings.curve:
        return None
    directory = os.environ.get(KEYS_ENV, "").strip() or settings.keys
    if not directory:
        if not required:
            return None
        raise TopologyError(
            f"{source}: security.keys: CURVE is on (the default) and these nodes are "
            "started by hosts' supervisors: name the cluster key directory (dstl keys "
            "generate DIR, copied to every host) or set security.curve: false"
        )
    try:
        return load_key_dir(Path(directory).expanduser())
    except KeyDirError as e:
        raise TopologyError(f"{source}: security.keys: {e}") from e


@dataclass(frozen=True)
class JobSecurity:
    """What a task gets from the driver (in its TaskConfig, through Spark): ``job``,
    the per-job CURVE settings of the coordinator link and the exchange, and ``nodes``,
    the writer's CURVE settings for its aggregator node. None = plaintext."""

    job: Curve | None = None
    nodes: Curve | None = None

    @classmethod
    def make(cls, auth: bool, cluster: ClusterKeys | None) -> JobSecurity:
        """A fresh job keypair when ``auth``; the nodes' client settings from
        ``cluster`` (only the writer's keypair and the node public keys are kept: during
        a key rotation both generations' node keys, see :meth:`Curve.for_writer`).
        Raises KeyDirError when ``cluster`` lacks the writer's secret key."""
        nodes = None
        if cluster is not None:
            if cluster.writer.secret is None:
                where = cluster.directory or "the cluster keys"
                raise KeyDirError(f"{where}: no writer.key_secret (the tasks need it)")
            trimmed = ClusterKeys(
                cluster.node.public_only(), cluster.writer, None, cluster.rotation
            )
            nodes = Curve.for_writer(trimmed)
        return cls(Curve.shared(job_keys()) if auth else None, nodes)


__all__ = ["KEYS_ENV", "JobSecurity", "SecuritySettings", "cluster_keys_for_nodes"]
