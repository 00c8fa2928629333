"""Spark Structured Streaming through the tree (docs/structured-streaming.md).

Unmodified queries write their state stores' files through the JVM checkpoint file
manager ``io.dstltree.spark.DstlCheckpointFileManager`` (``jvm/``), which sends them to
the bridge on the host (:mod:`.bridge`), which writes them into the tree.

- :func:`configure`: set a ``SparkSession.Builder`` up (the jar, the manager, the bridge
  socket; with a local master it starts the nodes and a bridge here). :func:`stop` ends
  what it started (also done at exit).
- :func:`jar_path`: the manager's jar, built from source with ``javac`` when missing.
- :mod:`.bridge`, :mod:`.wire`, :mod:`.view`, :mod:`.files`: the bridge and its parts.
"""

from dstltree.structured_streaming.configure import configure, started, stop
from dstltree.structured_streaming.jar import MANAGER_CLASS, JarBuildError, jar_path

__all__ = ["MANAGER_CLASS", "JarBuildError", "configure", "jar_path", "started", "stop"]
