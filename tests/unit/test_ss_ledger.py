"""The bridge's per-query figures (structured_streaming/ledger.py) and the protocol's
``status`` request and hello fallback report, driven bare."""

from __future__ import annotations

import pytest

from dstltree.structured_streaming import wire
from dstltree.structured_streaming.ledger import BATCH_WINDOW, MAX_JVMS, Ledger, batch_of


@pytest.mark.parametrize(
    ("path", "batch"),
    [
        ("commits/7", 7),
        ("state/0/3/8.delta", 7),
        ("state/0/3/9.snapshot", 8),
        ("state/1/0/2.changelog", 1),
        ("state/0/0/4.zip", 3),
        ("offsets/7", None),
        ("state/0/_metadata/schema", None),
        ("commits/x", None),
    ],
)
def test_batch_of(path: str, batch: int | None) -> None:
    assert batch_of(path) == batch


def test_figures_follow_writes_durables_and_commits() -> None:
    led = Ledger()
    led.on_write("file:/q", "state/0/0/1.delta", "app")
    led.on_durable("file:/q", "obj-1")
    led.on_durable("file:/q", "obj-1")
    led.on_commit("file:/q", now=10.0)
    led.on_write("file:/q", "commits/3", "app")
    led.on_durable("file:/q", "obj-2")
    led.on_durable("file:/q", "obj-3")
    led.on_commit("file:/q", now=11.0)
    led.on_plain_report("app", "1@h", 2)
    led.on_plain_report("app", "1@h", 1)  # an older report does not go back
    led.on_plain_report("other", "2@h", 5)  # another application's JVM
    (q,) = led.figures(now=12.5, held={"file:/q": 40})
    assert q["last_batch"] == 3 and q["commits"] == 2 and q["files_durable"] == 4
    assert q["objects_per_batch"] == 1.5 and q["last_commit_age"] == 1.5
    assert q["held_bytes"] == 40 and q["plain_files"] == 2 and q["apps"] == ["app"]
    led.validate()


def test_a_root_only_held_shows_and_windows_stay_bounded() -> None:
    led = Ledger()
    (q,) = led.figures(now=0.0, held={"dstl://q": 7})
    assert q["commits"] == 0 and q["objects_per_batch"] is None and q["last_batch"] is None
    for i in range(BATCH_WINDOW + 5):
        led.on_commit("dstl://q", now=float(i))
    for j in range(MAX_JVMS + 3):
        led.on_plain_report("a", f"{j}@h", 1)
    assert len(led.plain) == MAX_JVMS
    assert len(led.queries["dstl://q"].objects_per_commit) == BATCH_WINDOW
    led.validate()


def test_hello_carries_an_optional_plain_file_report() -> None:
    h = wire.parse_request({"op": "hello", "versions": [2], "app": "a", "plain": 4, "jvm": "9@x"})
    assert isinstance(h, wire.Hello) and (h.plain, h.jvm) == (4, "9@x")
    assert wire.parse_request({"op": "hello", "versions": [1]}) == wire.Hello((1,))
    for bad in ({"plain": -1}, {"plain": "3"}, {"jvm": "x" * 300}, {"jvm": "a\nb"}):
        with pytest.raises(wire.WireError) as info:
            wire.parse_request({"op": "hello", "versions": [2], **bad})
        assert info.value.code == "malformed"


def test_status_request_takes_no_fields_and_no_payload() -> None:
    assert wire.parse_request({"op": "status"}) == wire.Status()
    with pytest.raises(wire.WireError, match="unknown fields"):
        wire.parse_request({"op": "status", "root": "x"})
    with pytest.raises(wire.WireError, match="no payload"):
        wire.parse_request({"op": "status"}, b"x")
