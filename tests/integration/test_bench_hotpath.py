"""``dstl bench hotpath`` at tiny sizes: every figure and ratio present and positive,
the JSON and the "Hot path" section of a markdown file written (no timed assertions)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zmq
from typer.testing import CliRunner

from dstltree.bench import hotpath_net, hotpath_raw
from dstltree.bench.hotpath import write_markdown
from dstltree.bench.hotpath_latency import topology_floor
from dstltree.bench.hotpath_net import _Stream, deferrable_bytes
from dstltree.cli.app import app
from dstltree.client.api import ChangelogClient

EXPECTED = {
    "task loop with the changelog",
    "task loop, each key once per checkpoint",
    "last-wins staging, the demo's changes",
    "forwarding, node 64 KiB",
    "forwarding, node 1 MiB",
    "forwarding, chain of 2 nodes 1 MiB",
    "persist latency p50, one checkpoint of 64 KiB",
    "persist latency p50, 0.1 MB of 100-byte changes",
    "restore by replay, 20000 changes",
    "restore against 9a5af1e, value sets",
    "restore against 9a5af1e, the demo",
    "restore against 9a5af1e, list adds",
    "zstd segment compression, the demo's changes",
}


def test_hotpath_suite_tiny(tmp_path: Path) -> None:
    out, md = tmp_path / "hot.json", tmp_path / "BENCH.md"
    md.write_text("# Benchmarks\n\n## 1. Other\n\nkept\n")
    args = ["bench", "hotpath", "--seconds", "0.1", "--restore-changes", "20000"]
    args += ["--small-change-bytes", "100000", "--demo-records", "3000"]
    args += ["--json", str(out), "--markdown", str(md)]
    args += ["--workdir", str(tmp_path), "--forward-dir", str(tmp_path / "fwd")]
    (tmp_path / "fwd").mkdir()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    figures = {f["name"]: f for f in doc["figures"]}
    assert set(figures) == EXPECTED
    for f in figures.values():
        assert f["value"] > 0 and f["floor"] > 0 and f["ratio"] > 0, f
        deletions = {k: f["detail"].pop(k, 0) for k in ("deferred_bytes", "dropped_bytes")}
        assert f["detail"].pop("reserved_fallbacks", 0) >= 0, f
        assert f["detail"].pop("topology_fallbacks", 0) >= 0, f
        assert all(v > 0 for v in f["detail"].values()), f
        assert min(deletions.values()) >= 0, f
        if f["name"].startswith("forwarding"):  # every run drops objects, now or later
            assert sum(deletions.values()) > 0, f
    assert doc["meta"]["command"].startswith("dstl bench hotpath --seconds 0.1")
    assert doc["meta"]["command"].endswith(f"--forward-dir {tmp_path / 'fwd'}")
    assert list((tmp_path / "fwd").iterdir()) == []  # the forwarding stores are removed
    assert figures["forwarding, node 1 MiB"]["detail"]["store_bytes_per_s"] > 0
    latency = figures["persist latency p50, one checkpoint of 64 KiB"]["detail"]
    assert latency["floor_reserved_p50"] > 0 and latency["ratio_reserved_p50"] > 0
    assert latency["floor_topology_p50"] > 0 and latency["ratio_topology_p50"] > 0
    text = md.read_text()
    assert "## 1. Other\n\nkept" in text and text.count("## Hot path") == 1
    assert doc["meta"]["commit"] in text and "task loop with the changelog" in text


def test_markdown_section_is_replaced_in_place(tmp_path: Path) -> None:
    md = tmp_path / "B.md"
    md.write_text("# B\n\n## Hot path\n\nold\n\n## Next\n\nkept\n")
    write_markdown(md, "## Hot path\n\nnew\n")
    assert md.read_text() == "# B\n\n## Hot path\n\nnew\n\n## Next\n\nkept\n"


def test_a_run_replaces_its_section_and_never_adds_one(tmp_path: Path) -> None:
    """Runs after runs leave one section of the title, in its place: copies of it from
    older runs go (git keeps them), other titles, ``## Hot path on ...`` too, stay."""
    md = tmp_path / "B.md"
    md.write_text(
        "# B\n\n## Hot path\n\nrun 2\n\n## Hot path on abc\n\nkept\n\n"
        "## Hot path\n\nrun 1\n\n## Chaos\n\nkept too\n"
    )
    for run in (3, 4):
        write_markdown(md, f"## Hot path\n\nrun {run}\n")
    assert md.read_text() == (
        "# B\n\n## Hot path\n\nrun 4\n\n## Hot path on abc\n\nkept\n\n## Chaos\n\nkept too\n"
    )
    fresh = tmp_path / "new.md"
    write_markdown(fresh, "## Chaos\n\nfirst\n", "Chaos")
    write_markdown(fresh, "## Chaos\n\nsecond\n", "Chaos")
    assert fresh.read_text() == "## Chaos\n\nsecond\n"


def test_a_section_under_another_title_is_refused(tmp_path: Path) -> None:
    """A section titled per run (a date, a commit) would add a section every run."""
    md = tmp_path / "B.md"
    md.write_text("# B\n\n## Hot path\n\nold\n")
    with pytest.raises(ValueError, match="## Hot path"):
        write_markdown(md, "## Hot path on 0812844\n\nnew\n")
    assert md.read_text() == "# B\n\n## Hot path\n\nold\n"


@pytest.mark.parametrize("defer", [0, 1 << 40])
def test_forwarding_stream_defers_deletions_within_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, defer: int
) -> None:
    """Dropped objects are deleted during the run beyond the budget, after it within."""
    monkeypatch.setattr(hotpath_net, "_CHECKPOINT_BYTES", 64 * 1024)
    deleted: list[set[str]] = []
    with ChangelogClient.open(str(tmp_path / "s"), preemptive_bytes=16 * 1024) as client:
        stream = _Stream(
            client.create_writer("w", range(4)), b"x" * 16 * 1024, deleted.append, defer
        )
        sent = 0
        for _ in range(100):  # each run persists once at least (its first turn)
            sent += stream.run(0.001)
            if stream.deferred_bytes + stream.dropped_bytes >= 4 * 64 * 1024:
                break
        stream.drain()
        during = [paths for paths in deleted if paths]
        stream.close()
        after = [paths for paths in deleted if paths][len(during) :]
    assert stream.deferred_bytes + stream.dropped_bytes == sent  # every persist dropped
    if defer:
        assert (during, stream.dropped_bytes) == ([], 0)
        assert len(after) == 1 and after[0]  # one deletion after the run, of them all
    else:
        assert during and after == [] and stream.deferred_bytes == 0


def test_deferrable_bytes_is_a_quarter_of_the_free_space_at_most_8_gib(tmp_path: Path) -> None:
    room = deferrable_bytes(str(tmp_path / "not" / "made" / "yet"))
    assert 0 < room <= 8 << 30


def test_the_reserved_floor_writes_into_files_made_ahead(tmp_path: Path) -> None:
    with hotpath_raw.raw_hop(str(tmp_path)) as dealer:
        dealer.send_multipart([b"p", b"2"])
        assert dealer.recv() == b"0"
        ahead = {p: p.stat().st_ino for p in tmp_path.iterdir()}
        assert len(ahead) == 2 and all(p.stat().st_size == 0 for p in ahead)
        for _ in range(3):  # two into the files made ahead, one without any left
            dealer.send_multipart([b"r", b"body"])
            assert dealer.recv() == b"ok"
        assert all(p.stat().st_ino == ino and p.stat().st_size == 4 for p, ino in ahead.items())
        dealer.send_multipart([b"p", b"1"])
        assert dealer.recv() == b"1", "one write found no file ready"
        dealer.send_multipart([b"a", b"new"])  # a new file, the file made ahead kept
        assert dealer.recv() == b"ok"
        sizes = sorted(p.stat().st_size for p in tmp_path.iterdir())
        assert sizes == [0, 3, 4, 4, 4]
    sizes = sorted(p.stat().st_size for p in tmp_path.iterdir())
    assert sizes == [3, 4, 4, 4], "the receiver unlinks the files it made and never wrote"


def test_the_topology_floor_writes_each_body_into_a_file_made_ahead(tmp_path: Path) -> None:
    """The minimal node of the topology floor answers after writing the body into one
    of the files it made ahead (none written into a new file), unlinks the files left
    unused when asked, and its process ends with the context."""
    bodies = [os.urandom(1000 + k) for k in range(3)]
    with topology_floor(str(tmp_path)) as (client, node):
        assert client.round_trip(b"p", b"5") == b"0"
        assert len(list(tmp_path.iterdir())) == 5
        assert [client.round_trip(b"r", body) for body in bodies] == [b"ok"] * 3
        assert client.round_trip(b"p", b"0") == b"0"  # no write found no file ready
        written = sorted(p.read_bytes() for p in tmp_path.iterdir())
        assert written == sorted(bodies)
    assert not node.process.is_alive()


@pytest.mark.parametrize("depth", [1, 2])
def test_the_minimal_node_stores_what_it_receives_in_objects(tmp_path: Path, depth: int) -> None:
    """The minimal node of the forwarding figures (through a relay process when
    ``depth`` is 2) gathers the bodies it receives into objects of at least
    ``object_bytes`` written to new files, makes the rest durable when a turn ends
    (b"a", answered once written), and its processes end with the context."""
    bodies = [os.urandom(1000) for _ in range(7)]
    with hotpath_raw.raw_hop_process(str(tmp_path), depth, object_bytes=3000) as (dealer, procs):
        assert len(procs) == depth
        for body in bodies:
            dealer.send_multipart([b"n", body])
        dealer.send_multipart([b"a", b"x"])
        assert dealer.poll(10_000) and dealer.recv() == b"ok"
        files = sorted(tmp_path.iterdir(), key=lambda p: int(p.name.rsplit("-", 1)[1]))
        assert [p.read_bytes() for p in files] == [
            b"".join(bodies[0:3]),
            b"".join(bodies[3:6]),
            bodies[6],
        ]
    assert not any(p.process.is_alive() for p in procs)


def test_a_minimal_node_that_cannot_write_fails_the_turn_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A minimal node whose directory is gone fails its writes; the sender's wait for
    the end of its turn raises ``zmq.Again`` after the DEALER's timeout, and the
    receiving process is still stopped."""
    monkeypatch.setattr(hotpath_raw, "_DEALER_TIMEOUT_MS", 2000)
    gone = tmp_path / "gone"
    with (
        hotpath_raw.raw_hop_process(str(gone), 1, object_bytes=1000) as (dealer, procs),
        pytest.raises(zmq.Again),
    ):
        hotpath_raw.raw_send(dealer, os.urandom(1000), 0.05)
    assert not procs[0].process.is_alive()
