"""Which jar serves which Spark line (structured_streaming/jar.py), without building."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.structured_streaming import jar as jarmod


def test_every_supported_line_is_known_with_its_trait_package() -> None:
    assert list(jarmod.SPARK_LINES) == ["3.5", "4.0", "4.1", "4.2", "4.3"]
    for line in ("3.5", "4.0"):
        assert jarmod.SPARK_LINES[line].trait_package == jarmod.OLD_PACKAGE
    for line in ("4.1", "4.2", "4.3"):
        assert jarmod.SPARK_LINES[line].trait_package == jarmod.NEW_PACKAGE
    for s in jarmod.SPARK_LINES.values():
        assert jarmod.line_of(s.release) == s.line


@pytest.mark.parametrize(
    ("version", "line"),
    [("3.5.9", "3.5"), ("4.0.0", "4.0"), ("4.1.0.dev1", "4.1"), ("4.3.0", "4.3")],
)
def test_a_version_names_its_line(version: str, line: str) -> None:
    assert jarmod.spark_line(version).line == line


def test_a_newer_4x_line_uses_the_newer_package_and_older_or_5_are_refused() -> None:
    assert jarmod.spark_line("4.7.1").trait_package == jarmod.NEW_PACKAGE
    for version in ("3.4.4", "2.4.8", "5.0.0"):
        with pytest.raises(jarmod.JarBuildError, match="not supported"):
            jarmod.spark_line(version)
    with pytest.raises(jarmod.JarBuildError, match="cannot read"):
        jarmod.line_of("dev")


def test_the_shipped_jar_of_the_line_else_the_newest_of_its_package(tmp_path: Path) -> None:
    for line in ("3.5", "4.0", "4.1", "4.3"):
        (tmp_path / jarmod.jar_name(line)).write_bytes(b"PK")
    lines = jarmod.SPARK_LINES
    assert jarmod.shipped_jar(lines["4.0"], tmp_path) == tmp_path / "dstltree-spark-4.0.jar"
    # a known line without its jar is not served another line's
    assert jarmod.shipped_jar(lines["4.2"], tmp_path) is None
    # a line newer than all known: the newest shipped of the same package
    newer = jarmod.spark_line("4.9.0")
    assert jarmod.shipped_jar(newer, tmp_path) == tmp_path / "dstltree-spark-4.3.jar"
    assert jarmod.shipped_jar(newer, tmp_path / "none") is None


def test_older_lines_get_the_trait_package_rewritten_in_imports_only(tmp_path: Path) -> None:
    old = jarmod.line_sources(jarmod.SPARK_LINES["3.5"], tmp_path / "old")
    new = jarmod.line_sources(jarmod.SPARK_LINES["4.3"], tmp_path / "new")
    assert [p.name for p in old] == [p.name for p in new]
    old_text = "".join(p.read_text() for p in old)
    new_text = "".join(p.read_text() for p in new)
    assert f"import {jarmod.NEW_PACKAGE}." in new_text
    assert f"import {jarmod.NEW_PACKAGE}." not in old_text
    assert f"import {jarmod.OLD_PACKAGE}.CheckpointFileManager;" in old_text
    assert old_text.count("\n") == new_text.count("\n")


def test_a_jars_directory_names_its_spark_version(tmp_path: Path) -> None:
    (tmp_path / "spark-core_2.13-4.1.4.jar").write_bytes(b"")
    assert jarmod.spark_version_of(tmp_path) == "4.1.4"
    with pytest.raises(jarmod.JarBuildError, match="spark-core"):
        jarmod.spark_version_of(tmp_path / "x")


def test_the_wheel_build_names_the_lines_it_was_not_given(tmp_path: Path) -> None:
    with pytest.raises(jarmod.JarBuildError, match="3.5, 4.0"):
        jarmod.build_line_jars([], tmp_path, require=["3.5", "4.0"])
    assert jarmod.build_line_jars([], tmp_path) == {}
