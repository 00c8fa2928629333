"""Channel state (FLIP-76): which logged records a restore takes back and in what order,
with any parallelism. Pure: changes as the channel-state writer logs them."""

from __future__ import annotations

import pytest

from dstltree.sparkplug.channel_state import (
    channel_log_id,
    input_change,
    order_records,
    output_change,
)
from dstltree.sparkplug.exchange import ExchangeError, encode_batch
from dstltree.sparkplug.keygroups import key_group_of, key_group_range

MAX_P = 16


def _batch(*keys: str, tag: str = "") -> bytes:
    return encode_batch([(k, {"k": k, "tag": tag}) for k in keys])


def test_input_records_come_before_output_records_each_in_log_order() -> None:
    changes = [
        (output_change(_batch("a", "b", tag="out1")), "o@0"),
        (input_change(_batch("c", tag="in1")), "o@10"),
        (output_change(_batch("d", tag="out2")), "o@20"),
        (input_change(_batch("e", "f", tag="in2")), "o@30"),
    ]
    records, batches = order_records(changes, range(MAX_P), MAX_P)
    assert batches == 4
    # on one channel the receiver's input batches were sent before the sender's output
    # batches: every input record first keeps each key's order
    assert [(k, r["tag"]) for k, r in records] == [
        ("c", "in1"),
        ("e", "in2"),
        ("f", "in2"),
        ("a", "out1"),
        ("b", "out1"),
        ("d", "out2"),
    ]


@pytest.mark.parametrize("new_parallelism", [1, 2, 3, 5])
def test_rescaled_tasks_take_every_record_exactly_once(new_parallelism: int) -> None:
    keys = [f"user-{i}" for i in range(200)]
    changes = [
        (input_change(_batch(*keys[:120])), "x@0"),
        (output_change(_batch(*keys[120:])), "x@1"),
    ]
    taken: list[str] = []
    for task in range(new_parallelism):
        wanted = key_group_range(task, new_parallelism, MAX_P)
        records, _ = order_records(changes, wanted, MAX_P)
        assert all(key_group_of(k, MAX_P) in wanted for k, _ in records)
        taken += [k for k, _ in records]
    assert sorted(taken) == sorted(keys)


def test_a_change_that_is_no_logged_batch_names_where_it_lies() -> None:
    with pytest.raises(ExchangeError, match=r"obj@7: not a channel-state change"):
        order_records([(b"Zjunk", "obj@7")], range(MAX_P), MAX_P)
    with pytest.raises(ExchangeError, match=r"obj@9: malformed frame"):
        order_records([(b"I\xc1", "obj@9")], range(MAX_P), MAX_P)
    barrier = b"I" + bytes([0x92, 0x01, 0x05])  # msgpack [1, 5]: a barrier, not a batch
    with pytest.raises(ExchangeError, match=r"obj@11: a barrier where a batch"):
        order_records([(barrier, "obj@11")], range(MAX_P), MAX_P)


def test_channel_log_id_sits_beside_the_state_log() -> None:
    assert channel_log_id("job1-t3-a0") == "job1-t3-a0-cs"


def test_a_barrier_overtakes_the_batches_after_the_last_barrier() -> None:
    from collections import deque

    from dstltree.sparkplug.exchange import _overtake

    queue = deque([(False, b"d1"), (True, b"B1"), (False, b"d2"), (False, b"d3")])
    assert _overtake(queue, b"B2") == [b"d2", b"d3"]
    assert list(queue) == [
        (False, b"d1"),
        (True, b"B1"),
        (True, b"B2"),
        (False, b"d2"),
        (False, b"d3"),
    ]
    empty: deque[tuple[bool, bytes]] = deque()
    assert _overtake(empty, b"B") == [] and list(empty) == [(True, b"B")]


def test_checkpointing_options_are_checked_naming_the_option() -> None:
    from dstltree.sparkplug.job import check_checkpointing

    check_checkpointing("aligned", 0.0, 1)
    check_checkpointing("unaligned", 0.5, 1 << 20)
    with pytest.raises(ValueError, match="checkpointing must be one of"):
        check_checkpointing("Unaligned", 0.0, 1)
    with pytest.raises(ValueError, match="aligned_checkpoint_timeout"):
        check_checkpointing("aligned", 1.0, 1)
    with pytest.raises(ValueError, match="aligned_checkpoint_timeout"):
        check_checkpointing("unaligned", -1.0, 1)
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        check_checkpointing("unaligned", 0.0, 0)
