"""The fencing race (dstltree.bench.fencing_race): two drivers of one job start at
once, round after round, on stores whose conditional create is atomic: the local file
system (POSIX ``link``) and moto with serialized writes (dstltree.storage.atomic_moto;
moto's own create checks, then writes, without a lock). Every round has exactly one
winner and no acknowledged commit is lost. The benchmark runs 1,000 rounds
(``dstl bench fencing-race``); this is its shorter form."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dstltree.bench.fencing_race import run_race
from dstltree.storage.store import NO_RETRY, ObjectStore
from dstltree.storage.targets import start_local_s3

pytestmark = pytest.mark.timeout(600)


def test_on_the_local_file_system_every_round_has_one_winner(tmp_path: Path) -> None:
    r = run_race(lambda k: ObjectStore(str(tmp_path / f"job{k}")), rounds=200)
    assert r.rounds == 200 and r.winners == [1] * 200, r
    assert r.lost == 0 and r.acked >= 200 * 4, r


def test_on_an_s3_server_with_an_atomic_create_every_round_has_one_winner() -> None:
    s3 = start_local_s3(f"race-{uuid.uuid4().hex[:8]}", atomic=True)
    try:
        r = run_race(
            lambda k: ObjectStore(s3.url(f"job{k}"), s3.storage_options, retry=NO_RETRY),
            rounds=15,
        )
        writes = s3.server.writes
        assert writes is not None and writes.serialized >= r.acked  # every create locked
    finally:
        s3.stop()
    assert r.winners == [1] * 15 and r.lost == 0, r
