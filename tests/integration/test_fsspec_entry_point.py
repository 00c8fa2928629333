"""The fault-injecting filesystem reaches fsspec through the package's ``fsspec.specs``
entry point (pyproject.toml), not through an import made for its side effect: a fresh
process that never imports ``dstltree.client`` still opens ``faulty::`` URLs. The
storage package, imported alone, pulls in nothing above it."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.store import ObjectStore

ROOT = Path(__file__).resolve().parents[2]
TARGET = "dstltree.storage.faults:FaultyFileSystem"


def _installed() -> bool:
    return any(ep.name == "faulty" for ep in entry_points(group="fsspec.specs"))


needs_entry_point = pytest.mark.skipif(
    not _installed(),
    reason="the fsspec.specs entry point 'faulty' is not installed in this environment: "
    "re-install the package (pip install -e '.[dev]') after pyproject.toml changed",
)


def _python(code: str) -> str:
    """Run ``code`` in a fresh interpreter (this checkout first on the path); its stdout."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_pyproject_declares_the_entry_point() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    specs = doc["project"]["entry-points"]["fsspec.specs"]
    assert specs == {"faulty": TARGET}
    module, _, name = TARGET.partition(":")
    assert getattr(import_module(module), name) is FaultyFileSystem
    assert FaultyFileSystem.protocol == "faulty"


def test_importing_the_client_registers_nothing() -> None:
    out = _python(
        "from fsspec.registry import known_implementations, registry\n"
        "before = (dict(registry), dict(known_implementations))\n"
        "import dstltree.client\n"
        "print(before == (dict(registry), dict(known_implementations)))"
    )
    assert out == "True"


def test_storage_alone_imports_nothing_above_it() -> None:
    out = _python(
        "import sys\n"
        "import dstltree.storage.errors, dstltree.storage.faults, dstltree.storage.hedging\n"
        "import dstltree.storage.store, dstltree.storage.targets\n"
        "print(' '.join(sorted({m.split('.')[1] for m in sys.modules"
        " if m.startswith('dstltree.')})))"
    )
    # topology's schema holds the security settings (keys, CURVE on or off): both sit
    # below the client, the nodes and the coordinator
    assert out == "security storage topology"


@needs_entry_point
def test_entry_point_names_the_class() -> None:
    # an editable install plus a build's egg-info in the checkout may list it twice
    eps = [ep for ep in entry_points(group="fsspec.specs") if ep.name == "faulty"]
    assert {ep.value for ep in eps} == {TARGET}
    assert all(ep.load() is FaultyFileSystem for ep in eps)


@needs_entry_point
def test_fresh_process_opens_faulty_without_importing_dstltree() -> None:
    out = _python(
        "import sys, fsspec\n"
        "from fsspec.registry import known_implementations, registry\n"
        "assert 'faulty' in known_implementations and 'faulty' not in registry\n"
        "fs = fsspec.filesystem('faulty', target_protocol='memory', spec='local,seed=3')\n"
        "fs.pipe_file('/ep/x', b'abc')\n"
        "assert fs.cat_file('/ep/x') == b'abc'\n"
        "of, _ = fsspec.core.url_to_fs('faulty::memory://ep', faulty={'spec': 'none,seed=4'})\n"
        "print(type(fs).__module__, fs.spec.seed, of.spec.seed, dict(fs.counts)['put'],"
        " 'dstltree.client' in sys.modules)"
    )
    assert out == "dstltree.storage.faults 3 4 1 False"


@needs_entry_point
def test_chained_url(tmp_path: Path) -> None:
    chained = ObjectStore(f"faulty::{tmp_path}/c", {"faulty": {"spec": "local,seed=5"}})
    assert isinstance(chained.fs, FaultyFileSystem) and chained.fs.spec.seed == 5
    url = chained.new_object_path()
    assert url.startswith(f"{tmp_path}/c/changelog/"), "local paths stay plain"
    chained.put(url, b"zz")
    assert ObjectStore(str(tmp_path)).read(url) == b"zz"
    assert chained.fs.counts["put"] == 1
