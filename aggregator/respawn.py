"""A node that comes back by itself where no launcher watches it (a node started on an
executor from a Spark stage): ``dstl node --respawn-pid-file F ...`` runs the node as
its child and starts it again, with the same arguments (so the same id, endpoint and
parents), when it dies without being asked to: killed by a signal other than SIGTERM
or SIGINT, or exiting with an error. ``F`` always holds the running node's PID, so
whoever stops nodes by PID (SIGTERM) stops the node, and then the respawner ends too.
It also ends when the process ``exit_with_pid`` is gone (the node ends with it)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

#: exit codes of a node that was asked to stop (Popen's -N: killed by signal N)
STOPPED = (0, -signal.SIGTERM, -signal.SIGINT)
MAX_BACKOFF_S = 30.0
#: deaths in a row, each within QUICK_S of its start, after which the respawner gives up
MAX_QUICK_DEATHS = 10
QUICK_S = 10.0


def respawn(
    cmd: list[str],
    pid_file: Path,
    exit_with_pid: int | None = None,
    max_quick_deaths: int = MAX_QUICK_DEATHS,
    pass_fds: Sequence[int] = (),
) -> int:
    """Run ``cmd`` (a node) until it stops on purpose; restart it after each death,
    waiting 0.5, 1, 2 ... at most MAX_BACKOFF_S seconds when it dies again within
    QUICK_S seconds of a start, and give up (logged as an error) after
    ``max_quick_deaths`` such deaths in a row: a node that cannot start (a port taken,
    a broken key file) is not retried for ever; its writers go on through their other
    parent or straight to DFS. SIGTERM/SIGINT to this process are passed on to the
    node and end the loop. Each node inherits the descriptors ``pass_fds`` (the work
    directory's owner lock, dstltree.aggregator.workdirs). Returns the node's last exit
    code, after deleting ``pid_file``. Blocking."""
    stop = threading.Event()
    running: dict[str, subprocess.Popen[bytes]] = {}

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        node = running.get("node")
        if node is not None and node.poll() is None:
            node.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        return _supervise(
            cmd, pid_file, exit_with_pid, stop, running, max_quick_deaths, tuple(pass_fds)
        )
    finally:
        pid_file.unlink(missing_ok=True)  # no node of this respawner runs any more


def _supervise(
    cmd: list[str],
    pid_file: Path,
    exit_with_pid: int | None,
    stop: threading.Event,
    running: dict[str, subprocess.Popen[bytes]],
    max_quick_deaths: int = MAX_QUICK_DEATHS,
    pass_fds: tuple[int, ...] = (),
) -> int:
    """The loop of :func:`respawn` (``stop`` set by its signal handler)."""
    quick_deaths = 0
    while True:
        started = time.monotonic()
        node = running["node"] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=pass_fds)
        _write_pid(pid_file, node.pid)
        code = _wait(node, exit_with_pid, stop)
        if stop.is_set() or code in STOPPED or not _alive(exit_with_pid):
            return code
        quick_deaths = quick_deaths + 1 if time.monotonic() - started < QUICK_S else 0
        if quick_deaths >= max_quick_deaths:
            log.error(
                "node exited with code %s, %d times in a row within %.0f s of its start: "
                "not starting it again",
                code,
                quick_deaths,
                QUICK_S,
            )
            return code
        backoff = min(MAX_BACKOFF_S, 0.5 * 2.0 ** max(0, quick_deaths - 1))
        log.warning("node exited with code %s: starting it again in %.1f s", code, backoff)
        if stop.wait(backoff):
            return code


def _wait(proc: subprocess.Popen[bytes], exit_with_pid: int | None, stop: threading.Event) -> int:
    """The node's exit code; a node whose watched process is gone is stopped."""
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if not _alive(exit_with_pid) and not stop.is_set():
                stop.set()
                proc.terminate()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one of another user counts; a zombie, dead but not
    yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][:1] != "Z"
    return True


def _alive(pid: int | None) -> bool:
    return pid is None or pid_alive(pid)


def _write_pid(path: Path, pid: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(pid))
    tmp.replace(path)
