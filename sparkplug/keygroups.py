"""Key groups: keys hash to a key group in [0, max_parallelism); task i of P owns a
contiguous range of key groups (the unit of state redistribution on rescale).

A key is None, a bool, an int (64-bit range), a str, bytes, or a tuple of keys (nested
tuples allowed). Its key group is the CRC32 of its canonical msgpack encoding
(:func:`encode_key`: tuples as arrays, str as str, bytes as bin, so ``1``, ``True``,
``"1"`` and ``b"1"`` are different keys) modulo ``max_parallelism``: the same in every
process and every run. Keys travel through msgpack, which turns tuples into lists;
:func:`canonical_key` turns a decoded key back into the key.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack

DEFAULT_MAX_PARALLELISM = 128

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack encodes
_SCALAR_KEYS = (str, bytes, bool)  # built once, not per call
# CRC32 of the msgpack header of a str of n < 32 UTF-8 bytes (fixstr 0xa0 | n): the
# common short-str key hashes without building its encoding.
_FIXSTR_CRC = tuple(zlib.crc32(bytes([0xA0 | n])) for n in range(32))


def check_key(key: Any) -> None:
    """Raise TypeError (naming the type) unless ``key`` is None, bool, int, str, bytes
    or a tuple of keys; ValueError for an int outside [-2**63, 2**64 - 1]."""
    if type(key) is str or isinstance(key, _SCALAR_KEYS) or key is None:
        return
    if isinstance(key, int):
        if not _INT_MIN <= key <= _INT_MAX:
            raise ValueError(f"int key {key} is outside the 64-bit range msgpack encodes")
        return
    if isinstance(key, tuple):
        for part in key:
            check_key(part)
        return
    raise TypeError(
        f"a key must be None, bool, int, str, bytes or a tuple of them, not "
        f"{type(key).__name__} ({key!r:.60})"
    )


def encode_key(key: Any) -> bytes:
    """The canonical encoding of ``key`` (msgpack; tuples as arrays). Equal keys give
    equal bytes in every process. Raises TypeError / ValueError as :func:`check_key`."""
    check_key(key)
    data: bytes = msgpack.packb(key)
    return data


def key_group_of_encoded(encoded: bytes, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The key group of a key given its :func:`encode_key` bytes."""
    return zlib.crc32(encoded) % max_parallelism


def key_group_of(key: Any, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """A stable key group in [0, max_parallelism) for ``key``: CRC32 of
    :func:`encode_key` modulo ``max_parallelism``, the same in every process. Raises
    TypeError naming the type for a float, list, dict or any other non-key, ValueError
    for an int outside the 64-bit range."""
    if type(key) is str and len(key) < 32:
        data = key.encode()
        if len(data) < 32:
            return zlib.crc32(data, _FIXSTR_CRC[len(data)]) % max_parallelism
    return zlib.crc32(encode_key(key)) % max_parallelism


def task_of_key(key: Any, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The task (of ``parallelism``) owning ``key``'s key group. With one task the key
    is only checked (:func:`check_key`): its key group is computed once, where its state
    is kept (``KeyedStateBackend.set_current_key``). Raises TypeError / ValueError as
    :func:`key_group_of`."""
    if parallelism == 1:
        check_key(key)
        return 0
    kg = key_group_of(key, max_parallelism)
    return kg * parallelism // max_parallelism


def canonical_key(obj: Any) -> Any:
    """The key a msgpack-decoded key stands for: lists (msgpack's tuples) become
    tuples, recursively; anything else is returned as is (keys are never lists)."""
    if type(obj) is list:
        return tuple([canonical_key(x) for x in obj])
    return obj


def key_group_range(
    task: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> range:
    """Key groups owned by ``task`` of ``parallelism`` tasks: from ceil(task*M/P) to
    floor(((task+1)*M - 1)/P) inclusive, so that ``task_of_key_group`` (kg*P//M) is its
    exact inverse (the assignment Flink uses). Raises ValueError if parallelism exceeds
    max_parallelism."""
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} must be in 1..{max_parallelism}")
    if not 0 <= task < parallelism:
        raise ValueError(f"task {task} outside 0..{parallelism - 1}")
    start = (task * max_parallelism + parallelism - 1) // parallelism
    end = ((task + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def task_of_key_group(
    key_group: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> int:
    """The task owning ``key_group`` (inverse of key_group_range)."""
    return key_group * parallelism // max_parallelism
