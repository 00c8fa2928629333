"""StreamingJob's options are checked when the job is made, before Spark is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstltree.sparkplug import StreamingJob


def test_an_unknown_segment_codec_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compression 'lz4'"):
        StreamingJob(None, "job", str(tmp_path), compression="lz4")


def test_compression_reaches_the_run_options(tmp_path: Path) -> None:
    assert StreamingJob(None, "job", str(tmp_path), compression="zstd").options.compression == (
        "zstd"
    )
    assert StreamingJob(None, "job", str(tmp_path)).options.compression is None


def test_a_job_name_with_a_slash_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without '/'"):
        StreamingJob(None, "a/b", str(tmp_path))
