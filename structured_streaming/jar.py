"""The jar of the JVM checkpoint file manager (``jvm/``): one per Spark line.

The same Java sources compile against every supported Spark line (:data:`SPARK_LINES`,
3.5 to 4.3). They are written against Spark 4.1's package of ``CheckpointFileManager``
(``org.apache.spark.sql.execution.streaming.checkpointing``); for 3.5 and 4.0, whose trait
lives one package up, the build rewrites that package name in the copied sources and
nothing else (:func:`line_sources`), the one difference between the lines that the
sources cannot absorb themselves (``close()``, added to the trait in 4.1, is called
reflectively).

Where the jar comes from, in order (:func:`jar_path`):

1. the jar of the running Spark's line shipped in the installed wheel
   (``dstltree/structured_streaming/jars/dstltree-spark-<line>.jar``, built by the wheel
   build, :func:`build_line_jars`); a line newer than any shipped uses the newest shipped
   jar of the same trait package;
2. in a checkout (``jvm/`` beside the package), ``build/jvm/dstltree-spark-<line>.jar``,
   compiled with the JDK's ``javac --release 17`` against the installed pyspark's own
   ``jars/`` on first use and whenever older than a source (``make jar`` does the same).

Nothing is fetched and no binary is committed. Concurrent builds (pytest workers, two
sessions) take a file lock and replace the jar atomically, so a reader never sees half a
jar.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The repository: ``jvm/`` and ``build/`` live here (an editable install or a checkout)."""
SOURCES = REPO / "jvm" / "src" / "main" / "java"
BUILD_DIR = REPO / "build" / "jvm"
SHIPPED = Path(__file__).resolve().parent / "jars"
"""The jars a wheel ships, one per Spark line (absent in a checkout)."""
MANAGER_CLASS = "io.dstltree.spark.DstlCheckpointFileManager"
BUILD_TIMEOUT = 300.0  # seconds for javac and jar together

NEW_PACKAGE = "org.apache.spark.sql.execution.streaming.checkpointing"
OLD_PACKAGE = "org.apache.spark.sql.execution.streaming"


@dataclass(frozen=True)
class SparkLine:
    """A supported Spark line: ``line`` ("4.1"), the pyspark release the wheel build
    compiles against, and the package of its ``CheckpointFileManager`` trait."""

    line: str
    release: str
    trait_package: str


SPARK_LINES: dict[str, SparkLine] = {
    s.line: s
    for s in (
        SparkLine("3.5", "3.5.9", OLD_PACKAGE),
        SparkLine("4.0", "4.0.5", OLD_PACKAGE),
        SparkLine("4.1", "4.1.4", NEW_PACKAGE),
        SparkLine("4.2", "4.2.1", NEW_PACKAGE),
        SparkLine("4.3", "4.3.0", NEW_PACKAGE),
    )
}
"""Every Spark line the package supports (``pyspark>=3.5,<5`` in ``pyproject.toml``)."""


class JarBuildError(RuntimeError):
    """The jar cannot be found or built: no JDK (``javac``), no pyspark, an unsupported
    Spark line, no sources (an installed wheel without this line's jar), or javac failed
    (its output is in the message)."""


def line_of(version: str) -> str:
    """The line ("3.5") of a Spark version ("3.5.9", "4.1.0.dev1"). Raises JarBuildError
    for a version that names no major.minor."""
    m = re.match(r"^(\d+)\.(\d+)", version)
    if m is None:
        raise JarBuildError(f"cannot read a Spark line from version {version!r}")
    return f"{m.group(1)}.{m.group(2)}"


def spark_line(version: str) -> SparkLine:
    """The :class:`SparkLine` of ``version``: a known line, or a 4.x line newer than any
    known (the trait's 4.1+ package, built from the newest release's recipe). Raises
    JarBuildError for lines before 3.5 or from 5 on."""
    line = line_of(version)
    if line in SPARK_LINES:
        return SPARK_LINES[line]
    major, minor = (int(x) for x in line.split("."))
    newest = max(SPARK_LINES.values(), key=lambda s: _key(s.line))
    if major == 4 and (major, minor) > _key(newest.line):
        return SparkLine(line, version, NEW_PACKAGE)
    supported = ", ".join(SPARK_LINES)
    raise JarBuildError(f"Spark {version} is not supported (supported lines: {supported})")


def running_line() -> SparkLine:
    """The line of the installed pyspark (the Spark a session started here runs). Raises
    JarBuildError when pyspark is not installed or its line is unsupported."""
    try:
        import pyspark
    except ImportError as e:
        raise JarBuildError("the dstltree jar needs pyspark installed") from e
    return spark_line(pyspark.__version__)


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


def line_sources(line: SparkLine, into: Path) -> list[Path]:
    """Copies of :func:`java_sources` under ``into`` for ``line``: unchanged for 4.1+,
    with the trait's package rewritten (import lines only) for 3.5 and 4.0."""
    out = []
    for src in java_sources():
        dest = into / src.relative_to(SOURCES)
        dest.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        if line.trait_package != NEW_PACKAGE:
            text = re.sub(
                rf"^import {re.escape(NEW_PACKAGE)}\.",
                f"import {line.trait_package}.",
                text,
                flags=re.MULTILINE,
            )
        dest.write_text(text)
        out.append(dest)
    return out


def jar_name(line: str) -> str:
    """The file name of ``line``'s jar: ``dstltree-spark-<line>.jar``."""
    return f"dstltree-spark-{line}.jar"


def shipped_jar(line: SparkLine, shipped: Path | None = None) -> Path | None:
    """The wheel's jar for ``line`` (None: none shipped): its own, else for a line newer
    than every shipped one the newest shipped jar of the same trait package."""
    shipped = SHIPPED if shipped is None else shipped
    own = shipped / jar_name(line.line)
    if own.is_file():
        return own
    same = [
        s
        for s in SPARK_LINES.values()
        if s.trait_package == line.trait_package
        and _key(s.line) < _key(line.line)
        and (shipped / jar_name(s.line)).is_file()
    ]
    if line.line in SPARK_LINES or not same:
        return None
    return shipped / jar_name(max(same, key=lambda s: _key(s.line)).line)


def checkout_jar(line: SparkLine) -> Path:
    """Where a checkout builds ``line``'s jar: ``build/jvm/dstltree-spark-<line>.jar``."""
    return BUILD_DIR / jar_name(line.line)


def is_stale(jar: Path) -> bool:
    """True when ``jar`` is missing or older than any Java source."""
    if not jar.exists():
        return True
    built = jar.stat().st_mtime
    return any(src.stat().st_mtime > built for src in java_sources())


def jar_path(build: bool = True) -> Path:
    """The path of the manager's jar for the installed pyspark's line: the wheel's, else
    the checkout's, (re)built first when missing or older than its sources
    (``build=False``: never build; raises JarBuildError when it is missing).

    Builds take a few seconds. Raises JarBuildError naming ``javac`` when no JDK is on
    PATH, with javac's output when compiling fails, or when an installed package ships
    no jar for the running line and has no sources to build one."""
    line = running_line()
    shipped = shipped_jar(line)
    if shipped is not None:
        return shipped
    jar = checkout_jar(line)
    if not SOURCES.is_dir():
        lines = ", ".join(sorted(p.stem.rsplit("-", 1)[-1] for p in SHIPPED.glob("*.jar")))
        raise JarBuildError(
            f"this dstltree install ships no jar for Spark {line.line} "
            f"(shipped: {lines or 'none'}) and has no Java sources to build one"
        )
    if not build:
        if not jar.exists():
            raise JarBuildError(f"{jar} is missing: run `make jar` (needs a JDK 17 javac)")
        return jar
    if not is_stale(jar):
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with open(jar.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_stale(jar):  # another process may have built it while we waited
            build_jar(jar, line, pyspark_jars())
    return jar


def build_jar(jar: Path, line: SparkLine | None = None, jars: Path | None = None) -> None:
    """Compile the sources for ``line`` (None: the installed pyspark's) against the
    Spark jars in ``jars`` (None: the installed pyspark's ``jars/``) into ``jar``
    (replaced atomically), unconditionally. Raises JarBuildError."""
    javac = shutil.which("javac")
    jar_tool = shutil.which("jar")
    if javac is None or jar_tool is None:
        raise JarBuildError(
            "building the dstltree jar needs a JDK 17: no 'javac' (and 'jar') on PATH "
            "(install openjdk-17-jdk-headless, or run `make jar` where a JDK is)"
        )
    line = running_line() if line is None else line
    classpath = str((pyspark_jars() if jars is None else jars) / "*")
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent, prefix=".classes-") as tmp:
        sources = [str(s) for s in line_sources(line, Path(tmp) / "src")]
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [javac, "--release", "17", "-Xlint:all,-path", "-cp", classpath]
        _run([*cmd, "-d", str(classes), *sources])
        partial = Path(tmp) / jar.name
        _run([jar_tool, "--create", "--file", str(partial), "-C", str(classes), "."])
        os.replace(partial, jar)


def spark_version_of(jars: Path) -> str:
    """The Spark version of a ``jars/`` directory, read off its ``spark-core_*`` jar's
    name. Raises JarBuildError when there is none."""
    for p in sorted(jars.glob("spark-core_*.jar")):
        m = re.match(r"^spark-core_[\d.]+-(\d+\.\d+\.\d+.*)\.jar$", p.name)
        if m:
            return m.group(1)
    raise JarBuildError(f"{jars} holds no spark-core jar: not a Spark jars/ directory")


def build_line_jars(
    spark_jars: list[Path], into: Path, require: list[str] | None = None
) -> dict[str, Path]:
    """The wheel build's step: one jar per line into ``into`` (``dstltree-spark-<line>
    .jar``), each compiled against a Spark ``jars/`` directory of ``spark_jars`` (its
    line read off the directory). Returns line -> jar. Raises JarBuildError for an
    unsupported line, a failed compile, or a line of ``require`` with no directory."""
    built: dict[str, Path] = {}
    for jars in spark_jars:
        line = spark_line(spark_version_of(jars))
        jar = into / jar_name(line.line)
        build_jar(jar, line, jars)
        built[line.line] = jar
    missing = [line for line in require or [] if line not in built]
    if missing:
        raise JarBuildError(
            f"no Spark jars/ given for line(s) {', '.join(missing)} "
            "(DSTLTREE_SPARK_JARS names one jars/ directory per line; `make wheel` fetches them)"
        )
    return built


def _key(line: str) -> tuple[int, int]:
    major, minor = line.split(".")
    return int(major), int(minor)


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise JarBuildError(f"{cmd[0]} did not finish within {BUILD_TIMEOUT:.0f} s") from e
    if done.returncode != 0:
        raise JarBuildError(
            f"{Path(cmd[0]).name} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
        )


def main(argv: list[str]) -> int:
    """``python -m dstltree.structured_streaming.jar``: build (if needed) and print the
    running line's jar; ``--releases``: print ``<line> <release>`` per supported line."""
    if argv[1:] == ["--releases"]:
        for s in SPARK_LINES.values():
            print(s.line, s.release)
        return 0
    print(jar_path())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
