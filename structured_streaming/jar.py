"""The jar of the JVM checkpoint file manager (``jvm/``), built from source on first use.

``jar_path()`` returns ``build/jvm/dstltree-spark.jar`` in the repository, compiled with
the JDK's ``javac --release 17`` against the installed pyspark's own ``jars/`` (the same
recipe as ``make jar``): nothing is fetched and no binary is committed. A jar older than
any Java source is rebuilt. Concurrent builds (pytest workers, two sessions) take a file
lock and replace the jar atomically, so a reader never sees half a jar.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The repository: ``jvm/`` and ``build/`` live here (an editable install or a checkout)."""
SOURCES = REPO / "jvm" / "src" / "main" / "java"
JAR = REPO / "build" / "jvm" / "dstltree-spark.jar"
MANAGER_CLASS = "io.dstltree.spark.DstlCheckpointFileManager"
BUILD_TIMEOUT = 300.0  # seconds for javac and jar together


class JarBuildError(RuntimeError):
    """The jar cannot be built: no JDK (``javac``), no pyspark, no sources, or javac
    failed (its output is in the message)."""


def pyspark_jars() -> Path:
    """The ``jars/`` directory of the installed pyspark. Raises JarBuildError when
    pyspark is not installed."""
    try:
        import pyspark
    except ImportError as e:
        raise JarBuildError("building the dstltree jar needs pyspark installed") from e
    jars = Path(pyspark.__file__).parent / "jars"
    if not jars.is_dir():
        raise JarBuildError(f"pyspark has no jars directory at {jars}")
    return jars


def java_sources() -> list[Path]:
    """Every ``*.java`` below ``jvm/src/main/java``, sorted. Raises JarBuildError when
    there are none (an installed package without the repository's ``jvm/``)."""
    found = sorted(SOURCES.rglob("*.java"))
    if not found:
        raise JarBuildError(
            f"no Java sources under {SOURCES}: the jar is built from a checkout of dstltree"
        )
    return found


def is_stale(jar: Path | None = None) -> bool:
    """True when ``jar`` (None: :data:`JAR`) is missing or older than any Java source."""
    jar = JAR if jar is None else jar
    if not jar.exists():
        return True
    built = jar.stat().st_mtime
    return any(src.stat().st_mtime > built for src in java_sources())


def jar_path(build: bool = True) -> Path:
    """The path of the manager's jar, (re)built first when missing or older than its
    sources (``build=False``: never build; raises JarBuildError when it is missing).

    Builds take a few seconds (javac on five small classes). Raises JarBuildError naming
    ``javac`` when no JDK is on PATH, or with javac's output when compiling fails."""
    if not build:
        if not JAR.exists():
            raise JarBuildError(f"{JAR} is missing: run `make jar` (needs a JDK 17 javac)")
        return JAR
    if not is_stale(JAR):
        return JAR
    JAR.parent.mkdir(parents=True, exist_ok=True)
    with open(JAR.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_stale(JAR):  # another process may have built it while we waited
            build_jar(JAR)
    return JAR


def build_jar(jar: Path) -> None:
    """Compile the sources into ``jar`` (replaced atomically), unconditionally. Raises
    JarBuildError."""
    javac = shutil.which("javac")
    jar_tool = shutil.which("jar")
    if javac is None or jar_tool is None:
        raise JarBuildError(
            "building the dstltree jar needs a JDK 17: no 'javac' (and 'jar') on PATH "
            "(install openjdk-17-jdk-headless, or run `make jar` where a JDK is)"
        )
    sources = [str(s) for s in java_sources()]
    classpath = str(pyspark_jars() / "*")
    with tempfile.TemporaryDirectory(dir=jar.parent, prefix=".classes-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [javac, "--release", "17", "-Xlint:all,-path", "-cp", classpath]
        _run([*cmd, "-d", str(classes), *sources])
        partial = Path(tmp) / jar.name
        _run([jar_tool, "--create", "--file", str(partial), "-C", str(classes), "."])
        os.replace(partial, jar)


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise JarBuildError(f"{cmd[0]} did not finish within {BUILD_TIMEOUT:.0f} s") from e
    if done.returncode != 0:
        raise JarBuildError(
            f"{Path(cmd[0]).name} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
        )


if __name__ == "__main__":
    print(jar_path())
