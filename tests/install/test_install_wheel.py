"""Installs the way a Spark user does: ``make wheel``, then the wheel with its
dependencies into fresh virtual environments outside the repository (pip's cache
allowed), each run with ``javac`` hidden from ``PATH`` (a Java runtime only):

- pyspark 4.3 (what the wheel pulls in) and pyspark 3.5 (the oldest supported line,
  installed first): ``dstl demo --help``, a sparkplug job (a task killed, state and sink
  equal the batch answer), a Structured Streaming query through the tree (the driver
  killed mid-batch and restarted, state and sink equal the batch answer, nothing
  orphaned or missing), ``configure(builder, topology="local")`` with ``dstl status
  --bridges`` listing the running query, and ``dstl up local``;
- pyspark 4.1 installed first: installing the wheel keeps it, and the 4.1 jar shipped
  in the wheel is the one picked.

Marked ``install`` (deselected by default): ``.ci/run`` runs it as its own step.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.install, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
JDK_TOOLS = {"javac", "jar", "jshell", "jlink", "jdeps", "javadoc", "jarsigner", "jmod", "jpackage"}
PIP_TIMEOUT = 900  # s for one pip install (pyspark from pip's cache or PyPI)
RUN_TIMEOUT = 600  # s for one demo run


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The wheel ``make wheel`` builds from this checkout (every Spark line's jar)."""
    proc = subprocess.run(["make", "wheel"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    wheels = sorted((ROOT / "dist").glob("dstltree-*.whl"), key=lambda p: p.stat().st_mtime)
    assert wheels, "make wheel wrote no wheel under dist/"
    return wheels[-1]


def _no_jdk_path(tmp: Path) -> str:
    """A folder of links to every program on ``PATH`` except the JDK's tools: a
    machine with a Java runtime and no ``javac``."""
    d = tmp / "nojdk-bin"
    d.mkdir(parents=True)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not Path(folder).is_dir() or "venv" in folder:
            continue
        for p in Path(folder).iterdir():
            if p.name in JDK_TOOLS or (d / p.name).exists() or not os.access(p, os.X_OK):
                continue
            (d / p.name).symlink_to(p.resolve() if p.name == "java" else p)
    assert shutil.which("javac", path=str(d)) is None and shutil.which("java", path=str(d))
    return str(d)


class UserEnv:
    """A fresh virtual environment at ``path`` and the environment variables of a
    user's shell in it: its ``bin`` first, no JDK tools, no ``JAVA_HOME``, nothing of
    this checkout on ``PYTHONPATH``; commands run in ``cwd`` (outside the repository)."""

    def __init__(self, path: Path, nojdk: str, cwd: Path) -> None:
        self.path, self.cwd = path, cwd
        cwd.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
        env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHONPATH")}
        env = {k: v for k, v in env.items() if not k.startswith(("VIRTUAL_ENV", "PYSPARK"))}
        self.env = {**env, "PATH": f"{path / 'bin'}{os.pathsep}{nojdk}", "COLUMNS": "400"}

    def pip(self, *args: str) -> None:
        cmd = [str(self.path / "bin" / "python"), "-m", "pip", "install", "-q", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT)
        assert proc.returncode == 0, proc.stderr[-4000:]

    def run(self, *args: str, timeout: float = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(args), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        return proc

    def python(self, code: str, *args: str) -> str:
        return self.run(str(self.path / "bin" / "python"), "-c", code, *args).stdout

    def dstl(self, *args: str, timeout: float = RUN_TIMEOUT) -> str:
        return self.run(str(self.path / "bin" / "dstl"), *args, timeout=timeout).stdout

    def pyspark_version(self) -> str:
        return self.python("import pyspark; print(pyspark.__version__)").strip()

    def report(self, name: str, *args: str) -> dict[str, Any]:
        """The JSON report of one ``dstl demo`` run with ``args``, under ``cwd``."""
        report = self.cwd / f"{name}.json"
        base = self.cwd / name
        self.dstl("demo", "--base-path", str(base), "--report", str(report), *args)
        result: dict[str, Any] = json.loads(report.read_text())
        return result


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder outside the repository for the environments and their runs."""
    d = tmp_path_factory.mktemp("user")
    assert ROOT not in d.parents
    yield d


def _sparkplug(u: UserEnv) -> None:
    r = u.report(
        "sparkplug",
        *("--run-id", "u", "--limit-records", "20000", "--producer-seconds", "15"),
        *("--source-rate", "1000", "--kill-task-after", "4"),
    )
    assert r["state_matches_batch"] is True, r["mismatched_keys"]
    assert r["sink_matches_batch"] is True and r["sink_duplicate_rows"] == 0
    assert r["recoveries"] >= 1 and r["records"] == 20000


def _structured_streaming(u: UserEnv) -> None:
    r = u.report(
        "ss",
        *("--engine", "structured-streaming", "--limit-records", "20000"),
        *("--producer-seconds", "15", "--kill-task-after", "2"),
    )
    assert r["killed"] is not None and r["killed"]["mid_batch"] and r["recoveries"] == 1
    assert r["state_matches_batch"], r["mismatched_keys"]
    assert r["sink_matches_batch"] and r["sink_duplicate_rows"] == 0
    assert r["orphans"] == 0 and r["missing"] == 0


CONFIGURE = """
import json, subprocess, sys
from pathlib import Path
from pyspark.sql import SparkSession
from dstltree.structured_streaming import configure
from dstltree.structured_streaming.configure import stop

work = Path(sys.argv[1])
(work / "in").mkdir(parents=True)
for i in range(3):
    (work / "in" / f"{i}.json").write_text("".join(f'{{"k": {j % 5}}}\\n' for j in range(20)))
builder = SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2")
spark = configure(builder, topology="local", base_path=str(work / "tree")).getOrCreate()
try:
    counts = spark.readStream.schema("k INT").json(str(work / "in")).groupBy("k").count()
    q = (counts.writeStream.format("memory").queryName("counts").outputMode("complete")
         .option("checkpointLocation", str(work / "ckpt")).start())
    q.processAllAvailable()
    rows = {r["k"]: r["count"] for r in spark.sql("select * from counts").collect()}
    assert rows == {k: 12 for k in range(5)}, rows
    out = subprocess.run(["dstl", "status", "--bridges", "--json"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    queries = [qq for b in json.loads(out)["bridges"] if b["up"] for qq in b["queries"]]
    mine = [qq for qq in queries if qq["root"].rstrip("/").endswith(str(work / "ckpt"))]
    assert mine and mine[0]["commits"] >= 1 and mine[0]["files_durable"] >= 1, queries
    q.stop()
    print("configured", mine[0]["root"], mine[0]["commits"])
finally:
    spark.stop()
    stop()
"""


def _configure_and_status(u: UserEnv) -> None:
    out = u.python(CONFIGURE, str(u.cwd / "configured"))
    assert "configured" in out


def _up_local(u: UserEnv) -> None:
    """``dstl up local`` starts the shipped topology; ``dstl status`` reads its nodes."""
    cmd = [str(u.path / "bin" / "dstl"), "up", "local", "--base-path", str(u.cwd / "up")]
    proc = subprocess.Popen(cmd, cwd=u.cwd, env=u.env, stdout=subprocess.PIPE, text=True)
    try:
        workdir = _address_dir(proc)
        table = u.dstl("status", "--topology", "local", "--workdir", workdir, "--once")
        assert "7/7 nodes up" in table, table
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def _address_dir(proc: subprocess.Popen[str]) -> str:
    """The folder ``dstl up`` names in its ``address files in DIR:`` line (60 s)."""
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("address files in "):
                found.append(line.removeprefix("address files in ").split(":")[0].strip())
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(60)
    assert found, "dstl up printed no address files line within 60 s"
    return found[0]


@pytest.mark.parametrize("line", ["4.3", "3.5"])
def test_a_user_install_runs_both_front_doors_without_javac(
    wheel: Path, outside: Path, line: str
) -> None:
    from dstltree.structured_streaming.jar import SPARK_LINES

    release = SPARK_LINES[line].release
    u = UserEnv(outside / f"venv-{line}", _no_jdk_path(outside / line), outside / f"run-{line}")
    if line != "4.3":
        u.pip(f"pyspark=={release}")
    u.pip(str(wheel))
    assert u.pyspark_version() == release
    assert "--engine" in u.dstl("demo", "--help")
    jar = u.python("from dstltree.structured_streaming.jar import jar_path; print(jar_path())")
    assert f"dstltree-spark-{line}.jar" in jar and "site-packages" in jar
    _sparkplug(u)
    _structured_streaming(u)
    _configure_and_status(u)
    _up_local(u)


def test_installing_beside_pyspark_4_1_keeps_it(wheel: Path, outside: Path) -> None:
    from dstltree.structured_streaming.jar import SPARK_LINES

    release = SPARK_LINES["4.1"].release
    u = UserEnv(outside / "venv-4.1", _no_jdk_path(outside / "4.1"), outside / "run-4.1")
    u.pip(f"pyspark=={release}")
    u.pip(str(wheel))
    assert u.pyspark_version() == release
    jar = u.python("from dstltree.structured_streaming.jar import jar_path; print(jar_path())")
    assert "dstltree-spark-4.1.jar" in jar and "site-packages" in jar
    topo = u.python(
        "from dstltree.topology.catalog import topology_path; print(topology_path('local'))"
    )
    assert "site-packages" in topo and topo.strip().endswith("local.yaml")
