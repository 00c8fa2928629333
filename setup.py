"""The wheel build's one step beyond setuptools: the Structured Streaming jars.

``build_py`` also compiles ``jvm/`` into one jar per Spark line
(``dstltree/structured_streaming/jars/dstltree-spark-<line>.jar``, package data), with
``javac`` against each line's pyspark ``jars/`` named in ``DSTLTREE_SPARK_JARS``
(``os.pathsep``-separated; ``make wheel`` fetches one pyspark per supported line from
PyPI into ``build/spark-lines/``). ``DSTLTREE_REQUIRE_JARS`` (lines separated by spaces,
or ``all``) turns a missing line into a failed build; without it a wheel built with no
jars builds them on first use where a JDK and the sources are (editable installs never
ship jars: a checkout builds them under ``build/jvm``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _jar_module():
    spec = importlib.util.spec_from_file_location(
        "_dstltree_jar", HERE / "structured_streaming" / "jar.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class BuildPyWithJars(build_py):
    """``build_py``, then the jars of every Spark line given (see the module's text)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        jar = _jar_module()
        given = [Path(p) for p in os.environ.get("DSTLTREE_SPARK_JARS", "").split(os.pathsep) if p]
        wanted = os.environ.get("DSTLTREE_REQUIRE_JARS", "").split()
        require = list(jar.SPARK_LINES) if wanted == ["all"] else wanted
        into = Path(self.build_lib) / "dstltree" / "structured_streaming" / "jars"
        built = jar.build_line_jars(given, into, require=require)
        for line, path in sorted(built.items()):
            self.announce(f"built the jar for Spark {line}: {path}", level=2)


setup(cmdclass={"build_py": BuildPyWithJars})
