"""The wheel installs one import package, ``dstltree``, holding every part."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = {
    "aggregator",
    "bench",
    "cli",
    "client",
    "coordinator",
    "demo",
    "simulations",
    "sparkplug",
    "storage",
    "structured_streaming",
    "topology",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    src = tmp_path_factory.mktemp("src") / "dstltree"  # a copy: the build leaves files behind
    skip = shutil.ignore_patterns(".*", "build", "data", "reports", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, src, symlinks=True, ignore=skip)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "--wheel-dir",
        str(out),
        str(ROOT),
    ]
    subprocess.run(cmd, check=True, timeout=300, capture_output=True)
    (path,) = out.glob("dstltree-*.whl")
    return path


def test_only_top_level_name_is_dstltree(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"dstltree"}


def test_every_part_is_a_subpackage(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for part in PARTS:
        assert f"dstltree/{part}/__init__.py" in names, part
    assert "dstltree/cli/commands/demo.py" in names
    assert "dstltree/sparkplug/log4j2.properties" in names


def test_every_subpackage_of_the_tree_is_in_the_wheel(wheel: Path) -> None:
    """The ``packages`` list in pyproject.toml is explicit: a new subpackage must be
    added there, or the wheel silently lacks it."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for part in PARTS:
        for init in (ROOT / part).rglob("__init__.py"):
            rel = init.relative_to(ROOT).as_posix()
            assert f"dstltree/{rel}" in names, rel


def test_console_script_points_into_the_namespace(wheel: Path) -> None:
    zf = zipfile.ZipFile(wheel)
    (ep,) = [n for n in zf.namelist() if n.endswith("entry_points.txt")]
    assert "dstl = dstltree.cli.app:app" in zf.read(ep).decode()
